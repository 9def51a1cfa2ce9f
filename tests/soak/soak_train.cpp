// The training and save/load loops of qkv_soak (soak.cpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "layer_reference.h"
#include "qkv/layer.h"
#include "qkv/optim.h"
#include "finite_difference.h"
#include "soak_util.h"

namespace qkv::soak {

void prime_decode();

namespace {

using test::derivative;

// Small enough for finite differences of the float64 layer at the end; grouped-query heads and
// biases so every parameter and path of backward() is in the loop.
LayerConfig student_config() {
  return LayerConfig{.embed_dim = 12, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4, .bias = true, .seed = 11};
}

Tensor<float> normal(std::mt19937_64& rng, std::vector<int64_t> shape) {
  Tensor<float> t(shape);
  std::normal_distribution<float> dist;
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = dist(rng);
  return t;
}

// 0.5·mean squared error of the student against the teacher on x; dy (if given) its gradient.
double loss(const MultiHeadAttention& student, const MultiHeadAttention& teacher, const Tensor<float>& x,
            const AttentionOptions& options, LayerCache* cache, Tensor<float>* dy) {
  const Tensor<float> y = student.forward(x.cview(), {}, options, cache);
  const Tensor<float> t = teacher.forward(x.cview(), {}, options);
  std::vector<int64_t> shape(y.shape().begin(), y.shape().end());
  if (dy != nullptr) *dy = Tensor<float>(shape);
  double sum = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const double d = static_cast<double>(y[i]) - t[i];
    sum += d * d;
    if (dy != nullptr) (*dy)[i] = static_cast<float>(d / static_cast<double>(y.numel()));
  }
  return 0.5 * sum / static_cast<double>(y.numel());
}

// The trained layer against the float64 layer: forward within 2e-5 of max|y|, and one backward's
// gradients within 2e-4 of finite differences (the layer tests' tolerances). Returns both errors.
std::pair<double, double> check_against_float64(const MultiHeadAttention& layer, std::mt19937_64& rng) {
  const int64_t B = 2, N = 5, E = layer.config().embed_dim;
  const Tensor<float> x = normal(rng, {B, N, E});
  AttentionOptions options;
  options.mask.causal = CausalAlign::bottom_right;
  LayerCache cache;
  const Tensor<float> y = layer.forward(x.cview(), {}, options, &cache);
  const Tensor<float> dy = normal(rng, {B, N, layer.output_dim()});
  TensorMap grads;
  layer.backward(cache, dy.cview(), options, &grads);
  test::Weights64 w = test::weights64(layer);
  const std::vector<double> x64(x.data(), x.data() + x.numel());
  const std::vector<double> y64 = test::layer_forward64(layer.config(), w, x64, nullptr, B, N, N, options);
  double fwd = 0, scale = 1;
  for (std::size_t i = 0; i < y64.size(); ++i) {
    fwd = std::max(fwd, std::fabs(y[static_cast<int64_t>(i)] - y64[i]));
    scale = std::max(scale, std::fabs(y64[i]));
  }
  fwd /= scale;
  auto f = [&] {
    const std::vector<double> out = test::layer_forward64(layer.config(), w, x64, nullptr, B, N, N, options);
    double s = 0;
    for (std::size_t i = 0; i < out.size(); ++i) s += out[i] * dy[static_cast<int64_t>(i)];
    return s;
  };
  double grad = 0;
  for (auto& [name, values] : w) {
    std::vector<double> fd(values.size());
    double gscale = 0.1;
    for (std::size_t i = 0; i < values.size(); ++i) {
      fd[i] = derivative(&values[i], f);
      gscale = std::max(gscale, std::fabs(fd[i]));
    }
    const Tensor<float>& g = grads.at(name);
    for (std::size_t i = 0; i < values.size(); ++i)
      grad = std::max(grad, std::fabs(g[static_cast<int64_t>(i)] - fd[i]) / gscale);
  }
  return {fwd, grad};
}

}  // namespace

void prime() {
  prime_decode();
  std::mt19937_64 rng(0);
  MultiHeadAttention layer(student_config());
  check_against_float64(layer, rng);
}

void soak_train(int64_t steps, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  Memory mem;
  std::string report;
  {
    std::mt19937_64 rng(seed * 31 + 7);
    MultiHeadAttention student(student_config());
    LayerConfig tc = student_config();
    tc.seed = 12;
    const MultiHeadAttention teacher(tc);
    Optimizer opt(OptimizerConfig{.kind = OptimizerKind::adamw}, student.parameters());
    const int64_t E = student.config().embed_dim;
    const Tensor<float> validation = normal(rng, {4, 10, E});
    const double loss0 = loss(student, teacher, validation, {}, nullptr, nullptr);
    for (int64_t step = 0; step < steps; ++step) {
      mem.sample(step);
      if (step == warm_up_steps(steps)) mem.warm();
      // Batches of random shape, so the loop allocates and frees activations of every size.
      const int64_t B = std::uniform_int_distribution<int64_t>(1, 4)(rng);
      const int64_t N = std::uniform_int_distribution<int64_t>(1, 16)(rng);
      const Tensor<float> x = normal(rng, {B, N, E});
      AttentionOptions options;
      if (step % 2 == 0) options.mask.causal = CausalAlign::bottom_right;
      options.num_threads = 1;
      LayerCache cache;
      Tensor<float> dy;
      loss(student, teacher, x, options, &cache, &dy);
      TensorMap grads;
      student.backward(cache, dy.cview(), options, &grads);
      opt.step(grads, 3e-3);
    }
    if (steps <= warm_up_steps(steps)) mem.warm();
    mem.end("train");
    const double loss1 = loss(student, teacher, validation, {}, nullptr, nullptr);
    if (!(loss1 < 0.5 * loss0))
      fail(fmt::format("train: validation loss {:.4g} after training, {:.4g} before (expected at most half)", loss1,
                       loss0));
    for (const auto& [name, t] : student.parameters())
      for (int64_t i = 0; i < t->numel(); ++i)
        if (!std::isfinite((*t)[i])) fail(fmt::format("train: {}[{}] is not finite", name, i));
    const auto [fwd, grad] = check_against_float64(student, rng);
    if (!(fwd <= 2e-5)) fail(fmt::format("train: the trained layer's forward is {:.3g} from float64", fwd));
    if (!(grad <= 2e-4))
      fail(fmt::format("train: the trained layer's gradients are {:.3g} from finite differences", grad));
    report = fmt::format(
        "train: {} steps (AdamW, batches [1-4, 1-16, {}]); validation loss {:.4g} -> {:.4g}; at the end forward {:.2e} "
        "from float64 (<= 2e-5), gradients {:.2e} from finite differences (<= 2e-4); {}",
        steps, E, loss0, loss1, fwd, grad, mem.describe());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s; %.1f s\n", report.c_str(), secs);
  std::fflush(stdout);
}

void soak_io(int64_t rounds, const std::string& dir, uint64_t seed) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  Memory mem;
  std::string report;
  int64_t bytes = 0;
  {
    std::mt19937_64 rng(seed * 131 + 3);
    const fs::path file = fs::path(dir) / "layer.safetensors", npy_dir = fs::path(dir) / "layer_npy";
    fs::create_directories(npy_dir);
    MultiHeadAttention layer(LayerConfig{.embed_dim = 48, .num_heads = 4, .num_kv_heads = 2, .bias = true, .seed = 5});
    std::normal_distribution<float> dist;
    for (int64_t round = 0; round < rounds; ++round) {
      mem.sample(round);
      if (round == warm_up_steps(rounds)) mem.warm();
      for (auto& [name, t] : layer.parameters())
        for (int64_t i = 0; i < t->numel(); ++i) (*t)[i] = dist(rng);
      const fs::path where = round % 2 == 0 ? file : npy_dir;
      layer.save(where.string());
      const MultiHeadAttention back = MultiHeadAttention::load(where.string());
      if (back.metadata() != layer.metadata()) fail(fmt::format("io: round {}: the config did not round-trip", round));
      const auto want = layer.parameters();
      const auto got = back.parameters();
      for (std::size_t p = 0; p < want.size(); ++p) {
        const Tensor<float>& a = *want[p].second;
        const Tensor<float>& b = *got[p].second;
        if (got[p].first != want[p].first || a.numel() != b.numel() ||
            std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(float)) != 0)
          fail(fmt::format("io: round {} ({}): {} did not load back bit for bit", round, where.filename().string(),
                           want[p].first));
      }
      if (round == 0) bytes = static_cast<int64_t>(fs::file_size(file));
    }
    if (rounds <= warm_up_steps(rounds)) mem.warm();
    mem.end("io");
    std::set<std::string> left, expected{"layer.safetensors", "layer_npy"};
    for (const auto& e : fs::directory_iterator(dir)) left.insert(e.path().filename().string());
    for (const auto& e : fs::directory_iterator(npy_dir)) left.insert("layer_npy/" + e.path().filename().string());
    for (const auto& [name, t] : layer.parameters()) expected.insert("layer_npy/" + name + ".npy");
    if (rounds > 1) expected.insert("layer_npy/qkv_layer.json");
    for (const std::string& f : left)
      if (!expected.count(f)) fail(fmt::format("io: {} was left in {}", f, dir));
    report = fmt::format(
        "io: {} rounds of save and load ({}-byte safetensors file and an .npy directory in turn), "
        "weights bit for bit, no temporary file left; {}",
        rounds, bytes, mem.describe());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s; %.1f s\n", report.c_str(), secs);
  std::fflush(stdout);
}

}  // namespace qkv::soak
