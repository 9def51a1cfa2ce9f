// The bf16 overload of attention_forward: on every path (AVX512_BF16 pairs, or widening to fp32)
// its error against the float64 reference of the fp32 inputs stays within twice the error that
// rounding the inputs to bf16 causes by itself.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "qkv/attention.h"
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

TEST(FusedBf16, WithinTwiceTheInputRoundingErrorOnEveryPath) {
  test::Rng rng("FusedBf16.WithinTwice");
  int compared = 0;
  double worst_ratio = 0;
  for (int trial = 0; trial < 150; ++trial) {
    test::Problem p = test::random_problem(rng, 2e6);
    const test::Expected exact = test::reference_of(p);
    const test::Expected rounded = test::reference_of(rounded_copy(p));
    const double rounding_error = max_abs_diff(exact.out, rounded.out);
    const Bf16Copy q = round_to_bf16(p.q), k = round_to_bf16(p.k), v = round_to_bf16(p.v);
    for (Simd simd : test::available_paths()) {
      AttentionOptions options = p.options;
      options.simd = simd;
      options.num_threads = static_cast<int>(rng.uniform_int(1, 2));
      attention_forward(p.out.view, p.lse.view(), q.view, k.view, v.view, options);
      // Masked rows must be exact; the rest within 2x the rounding error plus fp32 slack.
      double max_ref = 0, err = 0;
      for (int64_t i = 0; i < exact.out.numel(); ++i) max_ref = std::max(max_ref, std::abs(exact.out[i]));
      const AttentionShape& s = p.shape;
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t i = 0; i < s.N; ++i) {
            const bool masked = std::isinf(exact.lse.view()(b, h, i));
            ASSERT_EQ(masked, std::isinf(p.lse.view()(b, h, i))) << p.describe;
            for (int64_t e = 0; e < s.Dv; ++e) {
              const double got = p.out.view(b, h, i, e);
              if (masked) {
                ASSERT_EQ(got, 0.0) << p.describe;
              }
              err = std::max(err, std::abs(got - exact.out.view()(b, h, i, e)));
            }
          }
      const double bound = 2 * rounding_error + 2e-5 * (1 + max_ref);
      ASSERT_LE(err, bound) << "trial " << trial << " path " << simd_path_name(simd) << " rounding error "
                            << rounding_error << ": " << p.describe;
      if (rounding_error > 0) worst_ratio = std::max(worst_ratio, err / rounding_error);
      ++compared;
    }
  }
  std::printf("bf16: %d comparisons, worst error / input-rounding error = %.2f\n", compared, worst_ratio);
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
