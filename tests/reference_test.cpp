// The float64 reference against the seeds' worked numbers and against direct definitions.
#include "qkv/reference.h"

#include <array>
#include <cmath>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qkv {
namespace {

// Seed 003: X (3 words, E = 4) and W_q, W_k, W_v (4 -> 4).
const double kX[3][4] = {{1, 0, 1, 0}, {0, 2, 0, 2}, {1, 1, 1, 1}};
const double kWq[4][4] = {{0.1, 0.2, 0, 0}, {0, 0.1, 0.3, 0}, {0.1, 0, 0, 0.2}, {0, 0, 0.2, 0.3}};
const double kWk[4][4] = {{0.2, 0, 0.1, 0}, {0, 0.1, 0, 0.3}, {0.1, 0, 0.2, 0}, {0, 0.2, 0, 0.1}};
const double kWv[4][4] = {{0, 0.1, 0, 0.2}, {0.2, 0, 0.2, 0}, {0, 0.3, 0.1, 0}, {0.1, 0, 0, 0.3}};

Tensor<double> project(const double (&w)[4][4]) {
  Tensor<double> out({1, 1, 3, 4});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int e = 0; e < 4; ++e) out[i * 4 + j] += kX[i][e] * w[e][j];
  return out;
}

TEST(Reference, ReproducesSeed003) {
  Tensor<double> q = project(kWq), k = project(kWk), v = project(kWv);
  Tensor<double> out({1, 1, 3, 4}), lse({1, 1, 3}), weights({1, 1, 3, 3});
  reference_attention_forward(out.view(), lse.view(), weights.view(), q.cview(), k.cview(), v.cview());
  const double want_weights[3] = {0.31359894, 0.35006362, 0.33633743};
  const double want_context[4] = {0.3109394, 0.25997455, 0.27228657, 0.44092668};
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(weights[j], want_weights[j], 1e-6);
  for (int e = 0; e < 4; ++e) EXPECT_NEAR(out[e], want_context[e], 1e-6);
  for (int i = 0; i < 3; ++i) {
    double sum = 0;
    for (int j = 0; j < 3; ++j) sum += weights[i * 3 + j];
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
}

TEST(Reference, FullyMaskedRowsAreZeroWithMinusInfLse) {
  test::Rng rng("Reference.FullyMasked");
  Tensor<double> q = rng.normal64({2, 2, 5, 3}), k = rng.normal64({2, 2, 4, 3}), v = rng.normal64({2, 2, 4, 6});
  Tensor<double> out({2, 2, 5, 6}), lse({2, 2, 5}), weights({2, 2, 5, 4});
  AttentionOptions options;
  options.mask.key_lengths = {0, 4};
  options.mask.query_lengths = {5, 3};
  reference_attention_forward(out.view(), lse.view(), weights.view(), q.cview(), k.cview(), v.cview(), options);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 5; ++i) {
      const bool masked_row = i >= 3;  // batch 0 has no keys at all; batch 1 has 3 valid queries
      EXPECT_EQ(lse.view()(0, h, i), -std::numeric_limits<double>::infinity());
      for (int64_t e = 0; e < 6; ++e) EXPECT_EQ(out.view()(0, h, i, e), 0.0);
      if (masked_row) {
        EXPECT_EQ(lse.view()(1, h, i), -std::numeric_limits<double>::infinity());
        for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(weights.view()(1, h, i, j), 0.0);
      } else {
        EXPECT_TRUE(std::isfinite(lse.view()(1, h, i)));
      }
    }
}

// Finite inputs whose scores or P·V sums pass float64's range gave NaN or a row of zeros without
// an error (q = 1e200 against k = ±1e200; v = 1e308 under equal scores); now refused as the fused
// kernel refuses its float32 overflow. NaN inputs, and rows a -inf bias empties, are not refused.
TEST(Reference, RefusesAnOverflowFromFiniteInputs) {
  const int64_t N = 3, D = 2;
  Tensor<double> q({1, 1, N, D}), k_pos({1, 1, N, D}), k_neg({1, 1, N, D}), zero({1, 1, N, D}), v({1, 1, N, D}),
      huge_v({1, 1, N, D}), out({1, 1, N, D});
  for (int64_t i = 0; i < q.numel(); ++i) {
    q[i] = 1e200, k_pos[i] = 1e200, k_neg[i] = -1e200, zero[i] = 0.0, v[i] = 1.0, huge_v[i] = 1e308;
  }
  // Views, not structured bindings: clang 14 cannot capture those in the lambda.
  for (const std::array<const Tensor<double>*, 3>& c :
       {std::array<const Tensor<double>*, 3>{&q, &k_pos, &v}, std::array<const Tensor<double>*, 3>{&q, &k_neg, &v},
        std::array<const Tensor<double>*, 3>{&zero, &zero, &huge_v}})
    test::expect_error(
        [&] { reference_attention_forward(out.view(), {}, {}, c[0]->cview(), c[1]->cview(), c[2]->cview()); },
        {"reference_attention_forward: the output overflowed float64 although q, k and v are finite"});
  q[0] = std::numeric_limits<double>::quiet_NaN();
  reference_attention_forward(out.view(), {}, {}, q.cview(), zero.cview(), v.cview());
  EXPECT_TRUE(std::isnan(out[0]));
  AttentionOptions options;  // a -inf bias that takes every key of row 0 away: that row is 0
  Tensor<float> bias({N, N});
  for (int64_t j = 0; j < N; ++j) bias[j] = -std::numeric_limits<float>::infinity();
  options.mask.bias = broadcast_mask(bias.cview(), 1, 1, N, N, "bias");
  reference_attention_forward(out.view(), {}, {}, zero.cview(), zero.cview(), v.cview(), options);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_EQ(out[D], 1.0);
}

// The float64 backward refuses the inputs the forward refuses, and gradients that overflow from
// finite inputs and dout: it returned NaN for every gradient (q = 1e200 against k = 1e200), zeros
// as if every row were masked (k = -1e200), and inf or NaN for dout·v past the range (v = 1e300,
// dout = 1e300), all without an error. NaN inputs (or dout), and rows a -inf bias empties, are
// not refused.
TEST(Reference, BackwardRefusesAnOverflowFromFiniteInputs) {
  const int64_t N = 3, D = 2;
  Tensor<double> q({1, 1, N, D}), k_pos({1, 1, N, D}), k_neg({1, 1, N, D}), v({1, 1, N, D}), huge({1, 1, N, D}),
      ones({1, 1, N, D});
  test::Rng rng("Reference.BackwardOverflow");
  for (int64_t i = 0; i < q.numel(); ++i) {
    q[i] = 1e200, k_pos[i] = 1e200, k_neg[i] = -1e200, v[i] = rng.uniform(-1, 1), ones[i] = 1.0;
    huge[i] = 1e300 * (i % 2 ? 1 : -0.5);
  }
  Tensor<double> dq({1, 1, N, D}), dk({1, 1, N, D}), dv({1, 1, N, D}), dbias({1, 1, N, N});
  const std::string message =
      "reference_attention_backward: the gradients overflowed float64 although q, k, v and dout are finite";
  // q, k, v, dout: scores past the range (either sign), then dout·v past it under distinct scores.
  Tensor<double> q_small = rng.normal64({1, 1, N, D}), k_small = rng.normal64({1, 1, N, D});
  for (const std::array<const Tensor<double>*, 4>& c :
       {std::array<const Tensor<double>*, 4>{&q, &k_pos, &v, &ones},
        std::array<const Tensor<double>*, 4>{&q, &k_neg, &v, &ones},
        std::array<const Tensor<double>*, 4>{&q_small, &k_small, &huge, &huge}}) {
    for (bool with_dbias : {false, true})
      test::expect_error(
          [&] {
            reference_attention_backward(dq.view(), dk.view(), dv.view(),
                                         with_dbias ? dbias.view() : TensorView<double>(), c[3]->cview(), c[0]->cview(),
                                         c[1]->cview(), c[2]->cview());
          },
          {message, "scale the inputs down"});
    // The forward refuses the first two itself; the third is the gradients' own overflow.
    Tensor<double> out({1, 1, N, D});
    if (c[1] != &k_small)
      EXPECT_THROW(reference_attention_forward(out.view(), {}, {}, c[0]->cview(), c[1]->cview(), c[2]->cview()), Error);
    else
      EXPECT_NO_THROW(reference_attention_forward(out.view(), {}, {}, c[0]->cview(), c[1]->cview(), c[2]->cview()));
  }
  // Finite gradients of large but representable inputs are returned (q = 1e200 against k = 1).
  reference_attention_backward(dq.view(), dk.view(), dv.view(), {}, ones.cview(), q.cview(), ones.cview(), v.cview());
  for (const Tensor<double>* g : {&dq, &dk, &dv})
    for (int64_t i = 0; i < g->numel(); ++i) EXPECT_TRUE(std::isfinite((*g)[i]));
  // A NaN in q or in dout is the caller's own: NaN gradients, no error.
  Tensor<double> nan_q = q_small.clone(), nan_dout = ones.clone();
  nan_q[0] = std::numeric_limits<double>::quiet_NaN();
  nan_dout[0] = std::numeric_limits<double>::quiet_NaN();
  reference_attention_backward(dq.view(), dk.view(), dv.view(), {}, ones.cview(), nan_q.cview(), k_small.cview(),
                               v.cview());
  EXPECT_TRUE(std::isnan(dq[0]));
  reference_attention_backward(dq.view(), dk.view(), dv.view(), {}, nan_dout.cview(), q_small.cview(), k_small.cview(),
                               huge.cview());
  EXPECT_TRUE(std::isnan(dq[0]));
  // A -inf bias that takes every key of row 0 away: that row's gradients are 0, no error.
  AttentionOptions options;
  Tensor<float> bias({N, N});
  for (int64_t j = 0; j < N; ++j) bias[j] = -std::numeric_limits<float>::infinity();
  options.mask.bias = broadcast_mask(bias.cview(), 1, 1, N, N, "bias");
  reference_attention_backward(dq.view(), dk.view(), dv.view(), dbias.view(), ones.cview(), q_small.cview(),
                               k_small.cview(), v.cview(), options);
  for (int64_t d = 0; d < D; ++d) EXPECT_EQ(dq[d], 0.0);
  for (int64_t i = 0; i < dq.numel(); ++i) EXPECT_TRUE(std::isfinite(dq[i]));
}

TEST(Reference, CausalBottomRightLastQuerySeesAllKeys) {
  test::Rng rng("Reference.CausalBottomRight");
  Tensor<double> q = rng.normal64({1, 1, 2, 4}), k = rng.normal64({1, 1, 5, 4}), v = rng.normal64({1, 1, 5, 4});
  Tensor<double> out({1, 1, 2, 4}), weights({1, 1, 2, 5});
  AttentionOptions options;
  options.mask.causal = CausalAlign::bottom_right;
  reference_attention_forward(out.view(), {}, weights.view(), q.cview(), k.cview(), v.cview(), options);
  for (int j = 0; j < 5; ++j) EXPECT_GT(weights.view()(0, 0, 1, j), 0.0);
  EXPECT_EQ(weights.view()(0, 0, 0, 4), 0.0);
  EXPECT_GT(weights.view()(0, 0, 0, 3), 0.0);
  options.mask.causal = CausalAlign::top_left;
  reference_attention_forward(out.view(), {}, weights.view(), q.cview(), k.cview(), v.cview(), options);
  EXPECT_GT(weights.view()(0, 0, 0, 0), 0.0);
  EXPECT_EQ(weights.view()(0, 0, 0, 1), 0.0);
}

TEST(Reference, RejectsBadShapes) {
  test::Rng rng("Reference.BadShapes");
  Tensor<double> q = rng.normal64({1, 3, 2, 4}), k = rng.normal64({1, 2, 5, 4}), v = rng.normal64({1, 2, 5, 4});
  Tensor<double> out({1, 3, 2, 4});
  EXPECT_THROW(reference_attention_forward(out.view(), {}, {}, q.cview(), k.cview(), v.cview()), Error);
  Tensor<double> q0 = rng.normal64({1, 2, 2, 0}), k0 = rng.normal64({1, 2, 5, 0});
  try {
    reference_attention_forward(out.view(), {}, {}, q0.cview(), k0.cview(), v.cview());
    FAIL() << "D = 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("D must be at least 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qkv
