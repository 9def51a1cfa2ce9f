// What the attention functions take as outputs and sizes: an output that shares memory with an
// input or with itself, negative sizes, diagonal offsets past any sequence, and the overflow rule
// with masks that can empty a row. Each refused input names the argument in its qkv::Error.
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/attention.h"
#include "qkv/backward.h"
#include "qkv/mask.h"
#include "qkv/reference.h"
#include "qkv/weights.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::expect_error;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t N = 5, M = 7, D = 4;

struct Problem {
  Tensor<float> q, k, v;
  explicit Problem(test::Rng& rng)
      : q(rng.normal32({1, 2, N, D})), k(rng.normal32({1, 2, M, D})), v(rng.normal32({1, 2, M, D})) {}
};

TEST(OutputViews, ForwardRefusesAnOutputThatSharesMemoryWithAnInputOrItself) {
  test::Rng rng("OutputViews.Forward");
  Problem p(rng);
  Tensor<float> out({1, 2, N, D}), lse({1, 2, N});
  for (const Kernel kernel : {Kernel::fused, Kernel::reference}) {
    AttentionOptions options;
    options.kernel = kernel;
    auto run = [&](TensorView<float> o, TensorView<float> l) {
      attention_forward(o, l, p.q.cview(), p.k.cview(), p.v.cview(), options);
    };
    expect_error([&] { run(p.q.view(), {}); }, {"out: shares memory with q"});
    expect_error([&] { run(TensorView<float>(p.k.data(), {1, 2, N, D}), {}); }, {"out: shares memory with k"});
    expect_error([&] { run(TensorView<float>(p.v.data() + 4, {1, 2, N, D}), {}); }, {"out: shares memory with v"});
    expect_error(
        [&] {
          run(out.view(), TensorView<float>(out.data() + 3, {1, 2, N}));
        },
        {"lse: shares memory with out"});
    const std::array<int64_t, 4> shape{1, 2, N, D}, rows_alike{0, D, 0, 1}, interleaved{0, N * D, 1, 1};
    expect_error([&] { run(TensorView<float>(out.data(), shape, rows_alike), {}); },
                 {"out: its strides make elements share memory"});
    expect_error([&] { run(TensorView<float>(out.data(), shape, interleaved), {}); },
                 {"out: its strides make elements share memory"});
    // Separate buffers in any layout are taken: a transposed out gives the contiguous result.
    run(out.view(), lse.view());
    Tensor<float> bnhd({1, N, 2, D});
    run(bnhd.view().transposed(1, 2), {});
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t e = 0; e < D; ++e) ASSERT_EQ(bnhd.cview()(0, i, h, e), out.cview()(0, h, i, e));
  }
  // The float64 reference's own outputs, the weights among them.
  const Tensor<double> q = to_contiguous<double>(p.q.cview()), k = to_contiguous<double>(p.k.cview()),
                       v = to_contiguous<double>(p.v.cview());
  Tensor<double> out64({1, 2, N, D}), weights({1, 2, N, M});
  // out inside the weights' own buffer (both views within the one allocation).
  expect_error(
      [&] {
        reference_attention_forward(TensorView<double>(weights.data() + 3, {1, 2, N, D}), {}, weights.view(), q.cview(),
                                    k.cview(), v.cview());
      },
      {"weights: shares memory with out"});
  reference_attention_forward(out64.view(), {}, weights.view(), q.cview(), k.cview(), v.cview());
}

TEST(OutputViews, BackwardRefusesGradientsThatShareMemory) {
  test::Rng rng("OutputViews.Backward");
  Problem p(rng);
  Tensor<float> out({1, 2, N, D}), lse({1, 2, N}), dout = rng.normal32({1, 2, N, D});
  attention_forward(out.view(), lse.view(), p.q.cview(), p.k.cview(), p.v.cview());
  Tensor<float> dq({1, 2, N, D}), dk({1, 2, M, D}), dv({1, 2, M, D});
  auto run = [&](TensorView<float> gq, TensorView<float> gk, TensorView<float> gv) {
    attention_backward(gq, gk, gv, {}, dout.cview(), p.q.cview(), p.k.cview(), p.v.cview(), out.cview(), lse.cview());
  };
  expect_error([&] { run(p.q.view(), dk.view(), dv.view()); }, {"dq: shares memory with q"});
  expect_error([&] { run(dq.view(), dk.view(), p.v.view()); }, {"dv: shares memory with v"});
  expect_error([&] { run(dout.view(), dk.view(), dv.view()); }, {"dq: shares memory with dout"});
  expect_error([&] { run(dq.view(), dk.view(), dk.view()); }, {"dv: shares memory with dk"});
  // k and v shared by both heads of a batch row through stride 0 take their gradients in a full
  // buffer, summed by the caller: a stride-0 dk would hold one head's gradient, not the sum.
  const std::array<int64_t, 4> shape{1, 2, M, D}, shared{2 * M * D, 0, D, 1};
  expect_error([&] { run(dq.view(), TensorView<float>(dk.data(), shape, shared), dv.view()); },
               {"dk: its strides make elements share memory"});
  Tensor<float> dbias({1, 2, N, M});
  const std::array<int64_t, 4> bias_shape{1, 2, N, M}, bias_shared{2 * N * M, 0, M, 1};
  expect_error(
      [&] {
        attention_backward(dq.view(), dk.view(), dv.view(), TensorView<float>(dbias.data(), bias_shape, bias_shared),
                           dout.cview(), p.q.cview(), p.k.cview(), p.v.cview(), out.cview(), lse.cview());
      },
      {"dbias: its strides make elements share memory"});
  run(dq.view(), dk.view(), dv.view());
}

TEST(OutputViews, WeightsRefuseAnOutputOverTheirInputs) {
  test::Rng rng("OutputViews.Weights");
  Problem p(rng);
  const std::vector<int64_t> rows{0, 2};
  Tensor<float> weights({1, 2, 2, M}), values({1, 2, 2, 3});
  Tensor<int64_t> indices({1, 2, 2, 3});
  expect_error(
      [&] {
        attention_weights_rows(TensorView<float>(p.k.data(), {1, 2, 2, M}), p.q.cview(), p.k.cview(), {}, rows);
      },
      {"weights: shares memory with k"});
  // Indices over the values' bytes: a buffer that holds the 12 int64 (so both views stay inside it).
  Tensor<int64_t> both({1, 2, 2, 3});
  expect_error(
      [&] {
        attention_weights_topk(TensorView<float>(reinterpret_cast<float*>(both.data()), {1, 2, 2, 3}), both.view(),
                               p.q.cview(), p.k.cview(), {}, rows, 3);
      },
      {"top-k indices: shares memory with top-k values"});
  attention_weights_rows(weights.view(), p.q.cview(), p.k.cview(), {}, rows);
  attention_weights_topk(values.view(), indices.view(), p.q.cview(), p.k.cview(), {}, rows, 3);
}

TEST(OutputViews, NegativeSizesAndHeadDimsAreNamed) {
  Tensor<float> x({1, 1, 3, 4});
  auto shapes = [](std::array<int64_t, 4> q, std::array<int64_t, 4> k, std::array<int64_t, 4> v) {
    check_attention_shapes(q, k, v, AttentionOptions{});
  };
  expect_error(
      [&] {
        shapes({1, 1, -1, 4}, {1, 1, 3, 4}, {1, 1, 3, 4});
      },
      {"q: negative dimension in shape [1, 1, -1, 4]"});
  expect_error([&] { shapes({1, 1, 3, 4}, {1, 1, -2, 4}, {1, 1, -2, 4}); }, {"k: negative dimension"});
  expect_error([&] { shapes({1, 1, 3, -4}, {1, 1, 3, -4}, {1, 1, 3, 4}); }, {"q: negative dimension"});
  expect_error([&] { shapes({1, 1, 3, 0}, {1, 1, 3, 0}, {1, 1, 3, 4}); }, {"head dim D must be at least 1, got 0"});
  // Through the kernels: refused before any work, the fused path as the reference.
  for (const Kernel kernel : {Kernel::fused, Kernel::reference}) {
    AttentionOptions options;
    options.kernel = kernel;
    const TensorView<const float> bad_k(x.data(), {1, 1, -2, 4});
    Tensor<float> out({1, 1, 3, 4});
    expect_error([&] { attention_forward(out.view(), {}, x.cview(), bad_k, bad_k, options); },
                 {"k: negative dimension"});
  }
}

// A view with a shape but no data passed every shape check and was read at address 0; an enum
// set from an integer ran as some other value; a shape past int64 overflowed the view's own
// stride arithmetic before any check could refuse it.
TEST(OutputViews, NullDataUnknownEnumsAndShapesPastInt64AreRefused) {
  test::Rng rng("OutputViews.Null");
  Problem p(rng);
  Tensor<float> out({1, 2, N, D}), lse({1, 2, N});
  const TensorView<const float> no_q(nullptr, {1, 2, N, D});
  expect_error([&] { attention_forward(out.view(), {}, no_q, p.k.cview(), p.v.cview()); },
               {"q: a null data pointer for shape [1, 2, 5, 4]"});
  AttentionOptions reference;
  reference.kernel = Kernel::reference;
  expect_error(
      [&] {
        attention_forward(TensorView<float>(nullptr, {1, 2, N, D}), {}, p.q.cview(), p.k.cview(), p.v.cview(),
                          reference);
      },
      {"out: a null data pointer"});
  attention_forward(out.view(), lse.view(), p.q.cview(), p.k.cview(), p.v.cview());
  Tensor<float> dq({1, 2, N, D}), dk({1, 2, M, D}), dv({1, 2, M, D});
  expect_error(
      [&] {
        attention_backward(dq.view(), dk.view(), dv.view(), {}, out.cview(), p.q.cview(), p.k.cview(), p.v.cview(),
                           out.cview(), TensorView<const float>(nullptr, {1, 2, N}));
      },
      {"lse: a null data pointer for shape [1, 2, 5]"});
  const std::vector<int64_t> rows{0};
  Tensor<float> weights({1, 2, 1, M});
  expect_error(
      [&] {
        attention_weights_rows(weights.view(), p.q.cview(), TensorView<const float>(nullptr, {1, 2, M, D}), {}, rows);
      },
      {"k: a null data pointer"});
  AttentionOptions bad;
  bad.kernel = static_cast<Kernel>(9);
  expect_error([&] { attention_forward(out.view(), {}, p.q.cview(), p.k.cview(), p.v.cview(), bad); },
               {"kernel = 9 is not a Kernel (automatic, reference or fused)"});
  bad = {};
  bad.mask.causal = static_cast<CausalAlign>(77);
  expect_error([&] { attention_forward(out.view(), {}, p.q.cview(), p.k.cview(), p.v.cview(), bad); },
               {"mask.causal = 77 is not a CausalAlign (top_left or bottom_right)"});
  bad = {};
  bad.mask.diagonal = static_cast<CausalAlign>(-1);
  expect_error([&] { attention_forward(out.view(), {}, p.q.cview(), p.k.cview(), p.v.cview(), bad); },
               {"mask.diagonal = -1 is not a CausalAlign"});
  const int64_t huge = int64_t{1} << 40;
  const TensorView<const float> wide(p.q.data(), {huge, huge, 3, D});
  EXPECT_EQ(wide.numel(), std::numeric_limits<int64_t>::max());
  expect_error([&] { attention_forward(out.view(), {}, wide, wide, wide); }, {"too large"});
}

TEST(OutputViews, DiagonalOffsetsPastTwoToTheSixtyAreRefused) {
  test::Rng rng("OutputViews.Offsets");
  Problem p(rng);
  Tensor<float> out({1, 2, N, D});
  for (const int64_t offset : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                               kMaxDiagonalOffset + 1, -kMaxDiagonalOffset - 1}) {
    AttentionOptions options;
    options.mask.causal = CausalAlign::top_left;
    options.mask.diagonal_offsets = {offset};
    expect_error([&] { attention_forward(out.view(), {}, p.q.cview(), p.k.cview(), p.v.cview(), options); },
                 {"diagonal_offsets[0] = " + std::to_string(offset) + " is outside ±2^60"});
  }
  // At the limit the band is what any larger offset would give: every key (causal) or none.
  AttentionOptions options;
  options.mask.causal = CausalAlign::top_left;
  options.mask.diagonal_offsets = {kMaxDiagonalOffset};
  Tensor<float> all({1, 2, N, D});
  attention_forward(out.view(), {}, p.q.cview(), p.k.cview(), p.v.cview(), options);
  attention_forward(all.view(), {}, p.q.cview(), p.k.cview(), p.v.cview());
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out[i], all[i]);
  options.mask.causal.reset();
  options.mask.window = Window{0, 0};
  options.mask.diagonal_offsets = {-kMaxDiagonalOffset};
  Tensor<float> lse({1, 2, N});
  attention_forward(out.view(), lse.view(), p.q.cview(), p.k.cview(), p.v.cview(), options);
  for (int64_t i = 0; i < lse.numel(); ++i) ASSERT_EQ(lse[i], -kInf);
}

// A keep mask or a -inf bias can empty a row; a row they leave a key that still comes out with
// every score -inf overflowed, and is refused as it is without a mask.
TEST(OutputViews, OverflowIsRefusedWhateverMaskCouldEmptyOtherRows) {
  Tensor<float> q({1, 1, 2, 4}), k({1, 1, 3, 4}), v({1, 1, 3, 4});
  for (int64_t i = 0; i < 8; ++i) q[i] = 1e20f;
  for (int64_t i = 0; i < 12; ++i) k[i] = -1e20f, v[i] = static_cast<float>(i);
  std::vector<uint8_t> keep{1, 1, 1, 0, 0, 0};  // row 0 keeps every key, row 1 none
  std::vector<float> bias{0, 0, 0, -kInf, -kInf, -kInf};
  for (const Kernel kernel : {Kernel::fused, Kernel::reference}) {
    for (int masked = 0; masked < 2; ++masked) {
      AttentionOptions options;
      options.kernel = kernel;
      if (masked == 0)
        options.mask.keep = TensorView<const uint8_t>(keep.data(), {1, 1, 2, 3});
      else
        options.mask.bias = TensorView<const float>(bias.data(), {1, 1, 2, 3});
      Tensor<float> out({1, 1, 2, 4});
      if (kernel == Kernel::fused)  // the float64 reference computes row 0, the documented remedy
        expect_error([&] { attention_forward(out.view(), {}, q.cview(), k.cview(), v.cview(), options); },
                     {"attention_forward: the output overflowed float32 although q, k and v are finite"});
      // Row 0 within range: row 1, emptied by the mask alone, is 0 with lse -inf.
      for (int64_t i = 0; i < 4; ++i) q[i] = 0.5f;
      Tensor<float> lse({1, 1, 2});
      attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
      EXPECT_EQ(lse[1], -kInf);
      for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(out[4 + e], 0.0f);
      for (int64_t i = 0; i < 4; ++i) q[i] = 1e20f;
    }
  }
}

TEST(OutputViews, BroadcastMaskTakesAViewOfNonConstFloats) {
  Tensor<float> bias({1, 3});
  const TensorView<const float> b = broadcast_mask(bias.view(), 2, 2, 4, 3, "bias");
  EXPECT_EQ(b.dim(0), 2);
  EXPECT_EQ(b.stride(2), 0);
}

}  // namespace
}  // namespace qkv
