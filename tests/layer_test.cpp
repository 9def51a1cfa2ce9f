// MultiHeadAttention against an independent float64 computation, the seeds' numbers, and its
// bad-input behaviour (save/load: layer_io_test.cpp).
#include "qkv/layer.h"

#include <array>
#include <cmath>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "layer_reference.h"
#include "qkv/reference.h"
#include "test_util.h"

namespace qkv {
namespace {

// The layer recomputed in float64 from its weights (tests/layer_reference.h).
std::vector<double> layer_reference(const MultiHeadAttention& layer, const Tensor<float>& x, const Tensor<float>* kv,
                                    int64_t B, int64_t N, int64_t M, const AttentionOptions& options) {
  const std::vector<double> x64(x.data(), x.data() + x.numel());
  std::vector<double> kv64;
  if (kv) kv64.assign(kv->data(), kv->data() + kv->numel());
  return test::layer_forward64(layer.config(), test::weights64(layer), x64, kv ? &kv64 : nullptr, B, N, M, options);
}

// max |got - want| / max(1, max |want|).
double rel_error(const Tensor<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  double err = 0, scale = 1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(double(got[static_cast<int64_t>(i)]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

void randomize_biases(MultiHeadAttention& layer, test::Rng& rng) {
  for (Tensor<float>* b : {&layer.b_q, &layer.b_k, &layer.b_v, &layer.b_o})
    for (int64_t i = 0; i < b->numel(); ++i) (*b)[i] = static_cast<float>(rng.uniform(-0.5, 0.5));
}

TEST(Layer, ForwardMatchesFloat64Recomputation) {
  test::Rng rng("Layer.ForwardMatchesFloat64");
  for (int trial = 0; trial < 40; ++trial) {
    LayerConfig c;
    c.num_kv_heads = rng.uniform_int(1, 3);
    c.num_heads = c.num_kv_heads * rng.uniform_int(1, 2);
    c.head_dim = std::array<int64_t, 6>{1, 3, 8, 17, 40, 59}[rng.uniform_int(0, 5)];
    c.value_dim = rng.uniform_int(0, 1) ? 0 : rng.uniform_int(1, 20);
    c.embed_dim = rng.uniform_int(1, 48);
    c.bias = rng.uniform_int(0, 1);
    c.output_projection = rng.uniform_int(0, 1);
    c.seed = rng.engine()();
    MultiHeadAttention layer(c);
    randomize_biases(layer, rng);
    const bool batched = rng.uniform_int(0, 1), cross = rng.uniform_int(0, 1);
    const int64_t B = batched ? rng.uniform_int(1, 3) : 1, N = rng.uniform_int(1, 9);
    const int64_t M = cross ? rng.uniform_int(1, 11) : N, E = c.embed_dim;
    Tensor<float> x =
        batched ? rng.normal32(std::array<int64_t, 3>{B, N, E}) : rng.normal32(std::array<int64_t, 2>{N, E});
    Tensor<float> kv =
        batched ? rng.normal32(std::array<int64_t, 3>{B, M, E}) : rng.normal32(std::array<int64_t, 2>{M, E});
    AttentionOptions options;
    if (rng.uniform_int(0, 2) == 0) options.mask.causal = CausalAlign::bottom_right;
    Tensor<float> y = layer.forward(x.cview(), cross ? kv.cview() : TensorView<const float>{}, options);
    ASSERT_EQ(y.rank(), batched ? 3 : 2);
    EXPECT_EQ(y.dim(y.rank() - 1), layer.output_dim());
    const double err = rel_error(y, layer_reference(layer, x, cross ? &kv : nullptr, B, N, M, options));
    EXPECT_LE(err, 2e-5) << "trial " << trial << " E=" << E << " H=" << c.num_heads << " Hkv=" << c.num_kv_heads
                         << " D=" << c.head_dim << " B=" << B << " N=" << N << " M=" << M << " cross=" << cross;
  }
}

TEST(Layer, StridedInputEqualsContiguous) {
  test::Rng rng("Layer.StridedInput");
  LayerConfig c{.embed_dim = 6, .num_heads = 2, .seed = 7};
  MultiHeadAttention layer(c);
  Tensor<float> x = rng.normal32(std::array<int64_t, 3>{4, 2, 6});  // stored [N, B, E]
  TensorView<const float> strided = x.cview().transposed(0, 1);     // seen as [B, N, E]
  Tensor<float> copy = to_contiguous<float>(strided);
  Tensor<float> a = layer.forward(strided), b = layer.forward(copy.cview());
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a[i], b[i]);
}

TEST(Layer, ParameterFreeIsAttentionOnX) {
  test::Rng rng("Layer.ParameterFree");
  for (int64_t E : {1, 3, 40}) {
    MultiHeadAttention layer(LayerConfig{.embed_dim = E, .parameter_free = true});
    EXPECT_TRUE(layer.parameters().empty());
    EXPECT_EQ(layer.output_dim(), E);
    const int64_t B = 2, N = 5;
    Tensor<float> x = rng.normal32(std::array<int64_t, 3>{B, N, E});
    Tensor<double> x64({B, 1, N, E});
    for (int64_t i = 0; i < x.numel(); ++i) x64[i] = x[i];
    Tensor<double> out({B, 1, N, E});
    reference_attention_forward(out.view(), {}, {}, x64.cview(), x64.cview(), x64.cview());
    Tensor<float> y = layer.forward(x.cview());
    std::vector<double> want(out.data(), out.data() + out.numel());
    EXPECT_LE(rel_error(y, want), 1e-6) << "E=" << E;
  }
}

// Seed 003's X, W_q, W_k, W_v (one head, no output projection) through the layer.
TEST(Layer, ReproducesSeed003) {
  const float x[3][4] = {{1, 0, 1, 0}, {0, 2, 0, 2}, {1, 1, 1, 1}};
  const float wq[16] = {0.1f, 0.2f, 0, 0, 0, 0.1f, 0.3f, 0, 0.1f, 0, 0, 0.2f, 0, 0, 0.2f, 0.3f};
  const float wk[16] = {0.2f, 0, 0.1f, 0, 0, 0.1f, 0, 0.3f, 0.1f, 0, 0.2f, 0, 0, 0.2f, 0, 0.1f};
  const float wv[16] = {0, 0.1f, 0, 0.2f, 0.2f, 0, 0.2f, 0, 0, 0.3f, 0.1f, 0, 0.1f, 0, 0, 0.3f};
  MultiHeadAttention layer(LayerConfig{.embed_dim = 4, .num_heads = 1, .output_projection = false});
  for (int i = 0; i < 16; ++i) {
    layer.w_q[i] = wq[i];
    layer.w_k[i] = wk[i];
    layer.w_v[i] = wv[i];
  }
  Tensor<float> y = layer.forward(TensorView<const float>(&x[0][0], {3, 4}));
  const double want[4] = {0.3109394, 0.25997455, 0.27228657, 0.44092668};
  for (int e = 0; e < 4; ++e) EXPECT_NEAR(y[e], want[e], 1e-6);
}

TEST(Layer, InitializationIsSeededAndBounded) {
  LayerConfig c{.embed_dim = 16, .num_heads = 4, .bias = true, .seed = 42};
  MultiHeadAttention a(c), b(c);
  c.seed = 43;
  MultiHeadAttention other(c);
  int differ = 0;
  const float bound = 1.0f / 4.0f;
  for (int64_t i = 0; i < a.w_q.numel(); ++i) {
    EXPECT_EQ(a.w_q[i], b.w_q[i]);
    EXPECT_LE(std::abs(a.w_q[i]), bound);
    differ += a.w_q[i] != other.w_q[i];
  }
  EXPECT_GT(differ, a.w_q.numel() / 2);
  for (int64_t i = 0; i < a.b_q.numel(); ++i) EXPECT_EQ(a.b_q[i], 0.0f);
  ASSERT_EQ(a.parameters().size(), 8u);
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Layer, RefusesBadConfigsAndShapes) {
  expect_error([] { MultiHeadAttention(LayerConfig{.embed_dim = 0}); }, "embed_dim must be at least 1");
  expect_error([] { MultiHeadAttention(LayerConfig{.embed_dim = 6, .num_heads = 4}); },
               "embed_dim = 6 is not divisible by num_heads = 4");
  expect_error(
      [] { MultiHeadAttention(LayerConfig{.embed_dim = 8, .num_heads = 4, .num_kv_heads = 3}); },
      "layer: num_heads, num_kv_heads: H = 4 query heads is not a positive multiple of Hkv = 3 key/value heads");
  // Only the counts given: num_kv_heads left at its default is not named (as 0).
  try {
    MultiHeadAttention(LayerConfig{.embed_dim = 8, .num_heads = 2, .parameter_free = true});
    ADD_FAILURE() << "a parameter-free layer of 2 heads was built";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "layer: parameter-free mode needs 1 head, got num_heads = 2");
  }
  expect_error(
      [] {
        MultiHeadAttention(LayerConfig{.embed_dim = 8, .num_heads = 1, .num_kv_heads = 2, .parameter_free = true});
      },
      "parameter-free mode needs 1 head, got num_heads = 1, num_kv_heads = 2");
  // Saved as JSON text, which holds only UTF-8: refused here, not by the save after training.
  expect_error([] { MultiHeadAttention(LayerConfig{.embed_dim = 8, .note = "on sent\xff.txt"}); },
               "layer: the note is not valid UTF-8 (byte 7)");
  // Widths that wrap in int64 (4 · 2^62 = 0) built empty weights, and forward died of SIGFPE.
  expect_error([] { MultiHeadAttention(LayerConfig{.embed_dim = 4, .num_heads = 4, .head_dim = int64_t{1} << 62}); },
               "layer: num_heads · head_dim = 4 · 4611686018427387904 is too large");
  expect_error([] { MultiHeadAttention(LayerConfig{.embed_dim = int64_t{1} << 40, .num_heads = 1}); },
               "layer: embed_dim · num_heads · head_dim = 1099511627776 · 1099511627776 is too large");
  MultiHeadAttention layer(LayerConfig{.embed_dim = 4, .num_heads = 2});
  Tensor<float> x({2, 3, 5}), x4({1, 1, 3, 4}), good({2, 3, 4}), kv({3, 5, 4}), kv2({5, 4});
  expect_error([&] { layer.forward(x.cview()); }, "x has width 5 but the layer's embed_dim is 4");
  expect_error([&] { layer.forward(x4.cview()); }, "x must be [N, E] or [B, N, E]");
  expect_error([&] { layer.forward(good.cview(), kv.cview()); }, "x has batch 2 but kv has batch 3");
  expect_error([&] { layer.forward(good.cview(), kv2.cview()); }, "kv must have the same rank as x");
}

// The weights are public members: one assigned another shape (w_q as PyTorch's [H·D, E]) was read
// past its end by the products, and save() wrote a file load() refused. Views with a shape but no
// data were read at address 0.
TEST(Layer, RefusesWeightsOfAnotherShapeAndInputsWithoutData) {
  MultiHeadAttention layer(LayerConfig{.embed_dim = 4, .num_heads = 2, .head_dim = 4});
  Tensor<float> x({3, 4});
  LayerCache cache;
  layer.forward(x.cview(), {}, {}, &cache);
  Tensor<float> dy({3, 4});
  layer.w_q = Tensor<float>({8, 4});
  expect_error([&] { layer.forward(x.cview()); },
               "layer: forward: w_q has shape [8, 4] but the layer's config needs [4, 8] (a weight assigned another");
  expect_error([&] { layer.backward(cache, dy.cview(), {}, nullptr); }, "layer backward: w_q has shape [8, 4]");
  expect_error([&] { layer.save("/nonexistent/never-written.safetensors"); }, "not saved: w_q has shape [8, 4]");
  layer.w_q = Tensor<float>({4, 8});
  layer.b_q = Tensor<float>({8});
  expect_error([&] { layer.forward(x.cview()); }, "b_q has shape [8] but the layer's config needs none");
  layer.b_q = Tensor<float>();
  const std::array<int64_t, 2> shape{3, 4};
  expect_error([&] { layer.forward(TensorView<const float>(nullptr, shape)); },
               "layer: x: a null data pointer for shape [3, 4]");
  expect_error([&] { layer.backward(cache, TensorView<const float>(nullptr, shape), {}, nullptr); },
               "layer backward: dy: a null data pointer for shape [3, 4]");
}

}  // namespace
}  // namespace qkv
