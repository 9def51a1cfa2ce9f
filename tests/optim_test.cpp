// Optimizers, clipping and the LR schedule against hand-computed values.
#include "qkv/optim.h"

#include <cmath>
#include <limits>
#include <cstring>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qkv {
namespace {

Tensor<float> vec(std::initializer_list<float> values) {
  Tensor<float> t({static_cast<int64_t>(values.size())});
  int64_t i = 0;
  for (float v : values) t[i++] = v;
  return t;
}

// Three steps on p = [1, -0.5, 0.25], lr 0.1, weight decay 0.01. The expected values were worked
// out by hand from the update rules in optim.h (first SGD step: g = 0.5 + 0.01·1, buf = g,
// p = 1 - 0.1·0.51 = 0.949) and agree with torch.optim.SGD / AdamW in float64.
const float kGrads[3][3] = {{0.5f, -1.0f, 2.0f}, {-0.25f, 0.75f, 0.0f}, {0.125f, 0.5f, -3.0f}};

void run_three_steps(const OptimizerConfig& config, const double (&want)[3][3]) {
  Tensor<float> p = vec({1.0f, -0.5f, 0.25f});
  Optimizer opt(config, {{"w", &p}});
  for (int s = 0; s < 3; ++s) {
    TensorMap grads;
    grads["w"] = vec({kGrads[s][0], kGrads[s][1], kGrads[s][2]});
    opt.step(grads, 0.1);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i], want[s][i], 1e-6) << "step " << s + 1 << " element " << i;
  }
  EXPECT_EQ(opt.step_count(), 3);
}

TEST(Optim, SgdMomentumMatchesHandComputedSteps) {
  const double want[3][3] = {{0.9490000000, -0.3995000000, 0.0497500000},
                             {0.9271510000, -0.3836505000, -0.1305247500},
                             {0.8940597490, -0.4190022995, 0.0073584997}};
  run_three_steps(OptimizerConfig{.kind = OptimizerKind::sgd, .momentum = 0.9, .weight_decay = 0.01}, want);
}

TEST(Optim, AdamWMatchesHandComputedSteps) {
  const double want[3][3] = {{0.8990000020, -0.3995000010, 0.1497500005},
                             {0.8714672987, -0.3901680004, 0.0825944256},
                             {0.8365529176, -0.4071092905, 0.1069695058}};
  run_three_steps(OptimizerConfig{.kind = OptimizerKind::adamw, .weight_decay = 0.01}, want);
}

TEST(Optim, StateRoundTripContinuesBitwise) {
  test::Rng rng("Optim.StateRoundTrip");
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    const OptimizerConfig config{.kind = kind, .weight_decay = 0.05};
    Tensor<float> a = rng.normal32(std::vector<int64_t>{4, 3}), b = a.clone();
    Optimizer straight(config, {{"w", &a}});
    Optimizer first_half(config, {{"w", &b}});
    std::vector<TensorMap> grads(6);
    for (auto& g : grads) g["w"] = rng.normal32(std::vector<int64_t>{4, 3});
    for (int s = 0; s < 3; ++s) {
      straight.step(grads[s], 0.01);
      first_half.step(grads[s], 0.01);
    }
    TensorMap saved;
    for (const auto& [name, view] : first_half.state()) saved[name] = to_contiguous<float>(view);
    Tensor<float> c = b.clone();
    Optimizer resumed(config, {{"w", &c}});
    resumed.load_state(saved, first_half.step_count());
    for (int s = 3; s < 6; ++s) {
      straight.step(grads[s], 0.01);
      resumed.step(grads[s], 0.01);
    }
    EXPECT_EQ(0, std::memcmp(a.data(), c.data(), a.numel() * sizeof(float))) << int(kind);
  }
}

TEST(Optim, ClipGradNormScalesToMaxNorm) {
  TensorMap grads;
  grads["a"] = vec({3.0f, 0.0f});
  grads["b"] = vec({4.0f});
  EXPECT_DOUBLE_EQ(clip_grad_norm(grads, 10.0), 5.0);  // under the limit: unchanged
  EXPECT_EQ(grads["a"][0], 3.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(grads, 1.0), 5.0);
  EXPECT_NEAR(grads["a"][0], 0.6f, 1e-7);
  EXPECT_NEAR(grads["b"][0], 0.8f, 1e-7);
  EXPECT_NEAR(clip_grad_norm(grads, 0.0), 1.0, 1e-7);  // max_norm 0: only measures
}

TEST(Optim, WarmupCosineSchedule) {
  const LrSchedule s{.base = 1.0, .min_lr = 0.1, .warmup = 4, .total = 14};
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);           // cosine starts at base
  EXPECT_NEAR(s.at(9), 0.1 + 0.45, 1e-12);  // halfway: cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(s.at(14), 0.1);
  EXPECT_DOUBLE_EQ(s.at(100), 0.1);
  for (int64_t t = 4; t < 14; ++t) EXPECT_GE(s.at(t), s.at(t + 1));
}

TEST(Optim, WarmupAsLongAsTheRunNeverDecays) {
  const LrSchedule s{.base = 1.0, .min_lr = 0.1, .warmup = 8, .total = 4};
  EXPECT_DOUBLE_EQ(s.at(3), 0.5);  // the run's last step: base * total / warmup
  EXPECT_DOUBLE_EQ(s.at(7), 1.0);  // the warm-up's own end, past the run
  EXPECT_DOUBLE_EQ(s.at(8), 1.0);  // then the decay, already past total: one step to min_lr
  EXPECT_DOUBLE_EQ(s.at(9), 0.1);
  for (int64_t t = 0; t < 7; ++t) EXPECT_LT(s.at(t), s.at(t + 1));
}

TEST(Optim, RefusesMissingOrMisshapenGradientsAndBadConfig) {
  Tensor<float> p = vec({1.0f, 2.0f});
  Optimizer opt(OptimizerConfig{}, {{"w", &p}});
  auto expect = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TensorMap grads;
  expect([&] { opt.step(grads, 0.1); }, "gradients: no tensor named w");
  grads["w"] = vec({1.0f});
  expect([&] { opt.step(grads, 0.1); }, "w has shape [1] but the parameter is [2]");
  EXPECT_EQ(p[0], 1.0f);  // nothing changed
  EXPECT_EQ(opt.step_count(), 0);
  expect([&] { opt.load_state({}, 3); }, "optimizer state: no tensor named adamw.m.w");
  expect([&] { Optimizer(OptimizerConfig{.beta1 = 1.0}, {}); }, "betas (1, 0.999) must be in [0, 1)");
  grads["w"] = vec({1.0f, 1.0f});
  expect([&] { opt.step(grads, std::nan("")); }, "learning rate nan must be finite");
  grads["w"] = vec({1.0f, std::numeric_limits<float>::infinity()});  // once turned w into NaN
  expect([&] { opt.step(grads, 0.1); }, "gradient w has a non-finite value (inf) at flat index 1; nothing was updated");
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(opt.step_count(), 0);
}

// A finite learning rate or gradient whose step passes float32's range once wrote -inf weights
// (and a moment of inf from a gradient near 3.4e38, squared): refused, nothing changed, by both
// optimizers; the same step at a small rate still goes through.
TEST(Optim, RefusesAStepPastFloat32sRange) {
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    Tensor<float> p = vec({1.0f, 2.0f});
    Optimizer opt(OptimizerConfig{.kind = kind}, {{"w", &p}});
    TensorMap grads;
    grads["w"] = vec({0.5f, 1.0f});
    const struct {
      double lr;
      float g;
      const char* what;
    } cases[] = {{1e308, 1.0f, "learning rate 1e+308 takes w past float32's range at flat index 0"},
                 {1e39, 1.0f, "learning rate 1e+39 takes w past float32's range at flat index 0"},
                 {2.0, 3e38f, "takes w past float32's range at flat index 1"}};
    for (const auto& c : cases) {
      grads["w"][1] = c.g;
      try {
        opt.step(grads, c.lr);
        ADD_FAILURE() << "accepted lr " << c.lr;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(c.what), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("nothing was updated"), std::string::npos) << e.what();
      }
      EXPECT_EQ(p[0], 1.0f);
      EXPECT_EQ(p[1], 2.0f);
      EXPECT_EQ(opt.step_count(), 0);
      for (const auto& [name, view] : opt.state())
        for (int64_t i = 0; i < view.numel(); ++i) EXPECT_EQ(view.data()[i], 0.0f) << name;
    }
    grads["w"][1] = 1.0f;
    opt.step(grads, 1e-3);
    EXPECT_EQ(opt.step_count(), 1);
    EXPECT_LT(p[0], 1.0f);
    // A weight decay that takes the weights out is named beside the rate (the message blamed the rate).
    Optimizer decaying(OptimizerConfig{.kind = kind, .weight_decay = 1e300}, {{"w", &p}});
    test::expect_error([&] { decaying.step(grads, 3e-5); },
                       {"learning rate 3e-05 with weight decay 1e+300 takes w past float32's range",
                        "(lower the learning rate or the weight decay)"});
  }
}

TEST(Optim, RefusesAParameterReplacedByAnotherShape) {
  // Its moments keep the shape they were made with: the step ran past the new, smaller tensor.
  Tensor<float> p = vec({1.0f, 2.0f, 3.0f});
  Optimizer opt(OptimizerConfig{.kind = OptimizerKind::adamw}, {{"w", &p}});
  p = vec({1.0f});
  TensorMap grads;
  grads["w"] = vec({0.5f});
  test::expect_error([&] { opt.step(grads, 1e-3); },
                     {"optimizer step: parameter w has shape [1] but had [3] when the optimizer was made"});
  EXPECT_EQ(p[0], 1.0f);
}

}  // namespace
}  // namespace qkv
