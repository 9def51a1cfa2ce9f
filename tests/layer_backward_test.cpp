// MultiHeadAttention::backward against float64 finite differences of the float64 layer
// (tests/layer_reference.h): every parameter, the input x and the cross-attention input kv.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "layer_reference.h"
#include "qkv/layer.h"
#include "finite_difference.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::derivative;

// Checks an fp32 gradient against finite differences of f over the float64 values `x`: error
// relative to max |fd| (floored at 0.1, where cancellation makes the exact gradient ~0).
void check_gradient(const std::string& name, const float* got, std::vector<double>& x, const std::function<double()>& f,
                    const std::string& note) {
  std::vector<double> fd(x.size());
  double scale = 0.1;
  for (std::size_t i = 0; i < x.size(); ++i) {
    fd[i] = derivative(&x[i], f);
    scale = std::max(scale, std::abs(fd[i]));
  }
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_LE(std::abs(got[i] - fd[i]) / scale, 2e-4)
        << name << "[" << i << "]: " << got[i] << " vs " << fd[i] << " " << note;
}

TEST(LayerBackward, MatchesFiniteDifferences) {
  test::Rng rng("LayerBackward.FiniteDifferences");
  for (int trial = 0; trial < 24; ++trial) {
    LayerConfig c;
    c.parameter_free = trial % 6 == 5;
    if (!c.parameter_free) {
      c.num_kv_heads = rng.uniform_int(1, 2);
      c.num_heads = c.num_kv_heads * rng.uniform_int(1, 2);
      c.head_dim = rng.uniform_int(1, 4);
      c.value_dim = rng.uniform_int(1, 4);
      c.bias = rng.uniform_int(0, 1);
      c.output_projection = rng.uniform_int(0, 1);
    }
    c.embed_dim = rng.uniform_int(1, 5);
    c.seed = rng.engine()();
    MultiHeadAttention layer(c);
    for (auto& [name, t] : layer.parameters())
      for (int64_t i = 0; i < t->numel(); ++i) (*t)[i] = static_cast<float>(rng.uniform(-1.0, 1.0));
    const bool batched = rng.uniform_int(0, 1), cross = rng.uniform_int(0, 1);
    const int64_t B = batched ? rng.uniform_int(1, 2) : 1, N = rng.uniform_int(1, 4),
                  M = cross ? rng.uniform_int(1, 5) : N;
    const int64_t E = c.embed_dim;
    auto shape = [&](int64_t rows) {
      return batched ? std::vector<int64_t>{B, rows, E} : std::vector<int64_t>{rows, E};
    };
    Tensor<float> x = rng.normal32(shape(N)), kv = rng.normal32(shape(M));
    AttentionOptions options;
    if (rng.uniform_int(0, 2) == 0) options.mask.causal = CausalAlign::bottom_right;
    if (rng.uniform_int(0, 3) == 0) options.mask.softcap = 2.0f;
    const TensorView<const float> kv_view = cross ? kv.cview() : TensorView<const float>{};

    LayerCache cache;
    Tensor<float> y = layer.forward(x.cview(), kv_view, options, &cache);
    std::vector<int64_t> y_shape(y.shape().begin(), y.shape().end());
    Tensor<float> dy = rng.normal32(y_shape);
    TensorMap grads;
    Tensor<float> dx, dkv;
    layer.backward(cache, dy.cview(), options, &grads, &dx, &dkv);

    const std::string note = fmt::format(
        "trial {} E={} H={} Hkv={} D={} Dv={} bias={} wo={} free={} B={} N={} M={} cross={}", trial, E,
        layer.config().num_heads, layer.config().num_kv_heads, layer.config().head_dim, layer.config().value_dim,
        c.bias, layer.config().output_projection, c.parameter_free, B, N, M, cross);
    test::Weights64 w = test::weights64(layer);
    std::vector<double> x64(x.data(), x.data() + x.numel()), kv64(kv.data(), kv.data() + kv.numel());
    auto loss = [&] {
      const std::vector<double> y64 =
          test::layer_forward64(layer.config(), w, x64, cross ? &kv64 : nullptr, B, N, M, options);
      double sum = 0.0;
      for (std::size_t i = 0; i < y64.size(); ++i) sum += y64[i] * dy[static_cast<int64_t>(i)];
      return sum;
    };
    ASSERT_EQ(grads.size(), w.size()) << note;
    for (auto& [name, values] : w) {
      ASSERT_TRUE(grads.count(name)) << name << " " << note;
      ASSERT_EQ(grads[name].numel(), static_cast<int64_t>(values.size())) << name << " " << note;
      check_gradient("d" + name, grads[name].data(), values, loss, note);
    }
    ASSERT_EQ(dx.numel(), x.numel()) << note;
    EXPECT_EQ(dx.rank(), x.rank()) << note;
    check_gradient("dx", dx.data(), x64, loss, note);
    if (cross) {
      ASSERT_EQ(dkv.numel(), kv.numel()) << note;
      check_gradient("dkv", dkv.data(), kv64, loss, note);
    } else {
      EXPECT_EQ(dkv.rank(), 0) << note;
    }
    if (HasFatalFailure()) return;
  }
}

TEST(LayerBackward, RefusesBadShapesAndEmptyCache) {
  test::Rng rng("LayerBackward.BadShapes");
  MultiHeadAttention layer(LayerConfig{.embed_dim = 4, .num_heads = 2, .seed = 3});
  Tensor<float> x = rng.normal32(std::vector<int64_t>{2, 3, 4}), bad({2, 3, 5});
  TensorMap grads;
  auto expect = [](const std::function<void()>& f, const std::string& needle) { test::expect_error(f, {needle}); };
  LayerCache empty;
  expect([&] { layer.backward(empty, x.cview(), {}, &grads); }, "the cache is empty");
  LayerCache cache;
  layer.forward(x.cview(), {}, {}, &cache);
  expect([&] { layer.backward(cache, bad.cview(), {}, &grads); },
         "dy has shape [2, 3, 5] but the forward's output is [2, 3, 4]");
  // Caches of other layers: the same E and H·Dv with 4 heads of 1 once reached attention_backward
  // ("lse: shape ... must be ..."); the others differ in a projection's width or in having one.
  const std::pair<LayerConfig, const char*> others[] = {
      {LayerConfig{.embed_dim = 4, .num_heads = 4, .seed = 3}, "(lse has shape [2, 4, 3], this layer needs [2, 2, 3])"},
      {LayerConfig{.embed_dim = 4, .num_heads = 2, .value_dim = 3, .seed = 3},
       "(v has shape [2, 3, 6], this layer needs [2, 3, 4])"},
      {LayerConfig{.embed_dim = 4, .num_heads = 1, .parameter_free = true},
       "(q has shape [], this layer needs [2, 3, 4])"}};
  for (const auto& [config, message] : others) {
    LayerCache theirs;
    MultiHeadAttention(config).forward(x.cview(), {}, {}, &theirs);
    expect([&] { layer.backward(theirs, x.cview(), {}, &grads); },
           std::string("the cache was filled by a layer with a different config ") + message);
  }
}

// A cache refilled from its own tensors: forward again on cache.x (and, cross, on cache.kv) reads
// them while it fills the cache, so they must outlive the copies (ASan: a use after free once).
TEST(LayerBackward, ForwardOnTheCachesOwnInputsGivesTheSameResults) {
  test::Rng rng("LayerBackward.ForwardOnTheCachesOwnInputs");
  for (bool cross : {false, true}) {
    MultiHeadAttention layer(LayerConfig{.embed_dim = 8, .num_heads = 2, .bias = true, .seed = 5});
    const Tensor<float> x = rng.normal32(std::vector<int64_t>{2, 3, 8}),
                        kv = rng.normal32(std::vector<int64_t>{2, 5, 8});
    const TensorView<const float> kv_in = cross ? kv.cview() : TensorView<const float>{};
    LayerCache cache;
    const Tensor<float> want = layer.forward(x.cview(), kv_in, {}, &cache);
    const Tensor<float> again =
        layer.forward(cache.x.cview(), cross ? cache.kv.cview() : TensorView<const float>{}, {}, &cache);
    ASSERT_EQ(want.numel(), again.numel());
    for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(want[i], again[i]) << "cross " << cross << " at " << i;
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(cache.x[i], x[i]) << "cross " << cross;
  }
}

// A loop that keeps one cache, one gradient map and one dx reuses their buffers: whatever they
// held (here NaN) never reaches a result, which is bitwise what fresh objects get. The shapes
// change between steps too, so each buffer is both reused and replaced.
TEST(LayerBackward, ReusedCacheAndGradientsGiveWhatFreshOnesGive) {
  test::Rng rng("LayerBackward.ReusedCache");
  const LayerConfig configs[] = {
      {.embed_dim = 8, .num_heads = 2, .bias = true, .seed = 1},
      {.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2, .head_dim = 3, .value_dim = 5, .seed = 2},
      {.embed_dim = 6, .num_heads = 2, .output_projection = false, .seed = 3},
      {.embed_dim = 8, .num_heads = 2, .bias = true, .residual = true, .seed = 4},
      {.embed_dim = 5, .parameter_free = true},
  };
  auto poison = [](Tensor<float>& t) { std::fill(t.data(), t.data() + t.numel(), std::nanf("")); };
  for (const LayerConfig& config : configs)
    for (bool cross : {false, true}) {
      if (cross && config.residual) continue;
      const MultiHeadAttention layer(config);
      const int64_t E = config.embed_dim;
      LayerCache cache;
      TensorMap grads;
      Tensor<float> dx, dkv;
      for (int64_t N : {3, 3, 4, 4}) {
        const Tensor<float> x = rng.normal32(std::vector<int64_t>{2, N, E}),
                            kv = rng.normal32(std::vector<int64_t>{2, 5, E});
        const TensorView<const float> kv_in = cross ? kv.cview() : TensorView<const float>{};
        const Tensor<float> y = layer.forward(x.cview(), kv_in, {}, &cache);
        const Tensor<float> dy = rng.normal32(y.shape());
        layer.backward(cache, dy.cview(), {}, &grads, &dx, &dkv);
        LayerCache fresh_cache;
        TensorMap fresh;
        Tensor<float> fresh_dx, fresh_dkv;
        const Tensor<float> want = layer.forward(x.cview(), kv_in, {}, &fresh_cache);
        layer.backward(fresh_cache, dy.cview(), {}, &fresh, &fresh_dx, &fresh_dkv);
        const std::string note = fmt::format("config seed {} cross {} N {}", config.seed, cross, N);
        auto same = [&](const Tensor<float>& got, const Tensor<float>& ref, const std::string& what) {
          ASSERT_EQ(got.numel(), ref.numel()) << what << " " << note;
          if (ref.numel() > 0) {  // an empty tensor's data is null, which memcmp may not take
            EXPECT_EQ(std::memcmp(got.data(), ref.data(), static_cast<std::size_t>(ref.numel()) * sizeof(float)), 0)
                << what << " " << note;
          }
        };
        same(y, want, "y");
        same(dx, fresh_dx, "dx");
        same(dkv, fresh_dkv, "dkv");
        ASSERT_EQ(grads.size(), fresh.size()) << note;
        for (const auto& [name, g] : fresh) same(grads.at(name), g, name);
        for (Tensor<float>* t :
             {&cache.x, &cache.kv, &cache.q, &cache.k, &cache.v, &cache.ctx, &cache.backward_dy, &cache.backward_dctx,
              &cache.backward_dq, &cache.backward_dk, &cache.backward_dv, &dx, &dkv})
          poison(*t);
        std::fill(cache.lse.data(), cache.lse.data() + cache.lse.numel(), std::nan(""));
        for (auto& [name, g] : grads) poison(g);
      }
    }
}

}  // namespace
}  // namespace qkv
