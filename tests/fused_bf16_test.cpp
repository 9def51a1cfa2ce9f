// The bf16 overload of attention_forward on every path (AVX512_BF16 pairs with P rounded to bf16,
// or widening to fp32), held to FlashAttention's rule for low precision.
#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "qkv/attention.h"
#include "qkv/reference.h"
#include "test_util.h"

namespace qkv {
namespace {

// The view's values rounded to bf16, in storage laid out like the view's.
struct Bf16Copy {
  Tensor<bf16> storage;
  TensorView<const bf16> view;
};

Bf16Copy round_to_bf16(const test::Strided& s) {
  Bf16Copy c{Tensor<bf16>({s.storage.numel()}), {}};
  for (int64_t i = 0; i < s.storage.numel(); ++i) c.storage[i] = float_to_bf16(s.storage[i]);
  const std::ptrdiff_t offset = s.view.data() - s.storage.data();
  c.view = TensorView<const bf16>(c.storage.data() + offset, s.view.shape(), s.view.strides());
  return c;
}

// The problem's inputs replaced by their bf16 roundings (as fp32), for the reference.
test::Problem rounded_copy(const test::Problem& p) {
  test::Problem r;
  r.shape = p.shape;
  r.options = p.options;
  auto copy = [](const test::Strided& s) {
    test::Strided c{Tensor<float>({s.storage.numel()}), {}};
    for (int64_t i = 0; i < s.storage.numel(); ++i) c.storage[i] = bf16_to_float(float_to_bf16(s.storage[i]));
    c.view = TensorView<float>(c.storage.data() + (s.view.data() - s.storage.data()), s.view.shape(), s.view.strides());
    return c;
  };
  r.q = copy(p.q), r.k = copy(p.k), r.v = copy(p.v);
  return r;
}

double max_abs_diff(const Tensor<double>& a, const Tensor<double>& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::isfinite(a[i]) && std::isfinite(b[i])) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

float round_bf16(double x) { return bf16_to_float(float_to_bf16(static_cast<float>(x))); }

// PyTorch's bf16 composite on the rounded inputs, emulated from the float64 reference's weights W
// and lse: logits log W + lse rounded to bf16, softmax in fp32 rounded to bf16 (torch.softmax on
// bf16), P·V summed in fp32 and rounded to bf16. (The real composite also rounds q·kᵀ before the
// scale and each mask term: its error is larger, so this bound is the stricter one.)
Tensor<double> bf16_composite(const test::Problem& rounded, const Tensor<double>& weights, const Tensor<double>& lse) {
  const AttentionShape& s = rounded.shape;
  const int64_t group = s.H / s.Hkv;
  Tensor<double> out({s.B, s.H, s.N, s.Dv});
  std::vector<float> p(static_cast<std::size_t>(s.M));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i) {
        const double row_lse = lse.cview()(b, h, i);
        float mx = -std::numeric_limits<float>::infinity(), l = 0.0f;
        for (int64_t j = 0; j < s.M; ++j) {
          const double w = weights.cview()(b, h, i, j);
          p[j] = w > 0 ? round_bf16(std::log(w) + row_lse) : -std::numeric_limits<float>::infinity();
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j < s.M; ++j) l += p[j] = std::isinf(mx) ? 0.0f : std::exp(p[j] - mx);
        for (int64_t j = 0; j < s.M; ++j) p[j] = l > 0 ? round_bf16(p[j] / l) : 0.0f;
        for (int64_t e = 0; e < s.Dv; ++e) {
          float acc = 0.0f;
          for (int64_t j = 0; j < s.M; ++j) acc += p[j] * rounded.v.view(b, h / group, j, e);
          out.view()(b, h, i, e) = round_bf16(acc);
        }
      }
  return out;
}

// FlashAttention's rule for low precision on every property case: max|out − out_ref| ≤
// 2·max|out_pt − out_ref| + 1e-5, out_ref the float64 reference and out_pt the bf16 composite, both
// on the bf16-rounded inputs. Masked rows must be exactly 0 with lse -inf.
TEST(FusedBf16, FlashAttentionRuleOnEveryPath) {
  test::Rng rng("FusedBf16.FlashAttentionRule");
  int compared = 0;
  double worst_ratio = 0;
  for (int trial = 0; trial < 150; ++trial) {
    test::Problem p = test::random_problem(rng, 2e6);
    const test::Problem r = rounded_copy(p);
    const AttentionShape& s = p.shape;
    Tensor<double> want({s.B, s.H, s.N, s.Dv}), want_lse({s.B, s.H, s.N}), weights({s.B, s.H, s.N, s.M});
    const Tensor<double> q64 = to_contiguous<double>(TensorView<const float>(r.q.view));
    const Tensor<double> k64 = to_contiguous<double>(TensorView<const float>(r.k.view));
    const Tensor<double> v64 = to_contiguous<double>(TensorView<const float>(r.v.view));
    reference_attention_forward(want.view(), want_lse.view(), weights.view(), q64.cview(), k64.cview(), v64.cview(),
                                p.options);
    const double bound = 2 * max_abs_diff(bf16_composite(r, weights, want_lse), want) + 1e-5;
    const Bf16Copy q = round_to_bf16(p.q), k = round_to_bf16(p.k), v = round_to_bf16(p.v);
    for (Simd simd : test::available_paths()) {
      AttentionOptions options = p.options;
      options.simd = simd;
      options.num_threads = static_cast<int>(rng.uniform_int(1, 2));
      attention_forward(p.out.view, p.lse.view(), q.view, k.view, v.view, options);
      double err = 0;
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t i = 0; i < s.N; ++i) {
            const bool masked = std::isinf(want_lse.view()(b, h, i));
            ASSERT_EQ(masked, std::isinf(p.lse.view()(b, h, i))) << p.describe;
            for (int64_t e = 0; e < s.Dv; ++e) {
              const double got = p.out.view(b, h, i, e);
              if (masked) {
                ASSERT_EQ(got, 0.0) << p.describe;
              }
              err = std::max(err, std::abs(got - want.view()(b, h, i, e)));
            }
          }
      ASSERT_LE(err, bound) << "trial " << trial << " path " << simd_path_name(simd) << ": " << p.describe;
      worst_ratio = std::max(worst_ratio, err / bound);
      ++compared;
    }
  }
  std::printf("bf16: %d comparisons, worst error / FlashAttention bound = %.3f\n", compared, worst_ratio);
}

TEST(FusedBf16, ReferenceKernelWidensTheInputs) {
  test::Rng rng("FusedBf16.Reference");
  test::Problem p = test::random_problem(rng, 2e5);
  const test::Expected rounded = test::reference_of(rounded_copy(p));
  const Bf16Copy q = round_to_bf16(p.q), k = round_to_bf16(p.k), v = round_to_bf16(p.v);
  AttentionOptions options = p.options;
  options.kernel = Kernel::reference;
  attention_forward(p.out.view, p.lse.view(), q.view, k.view, v.view, options);
  EXPECT_EQ(test::compare_to_reference(p, rounded, 1e-6), "") << p.describe;
}

}  // namespace
}  // namespace qkv
