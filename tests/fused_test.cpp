// The fused forward kernel against the float64 reference: random problems on every SIMD path,
// fully masked rows, NaN propagation, and the choice of path.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "kernels/dispatch.h"
#include "kernels/forward.h"
#include "kernels/softcap.h"
#include "qkv/attention.h"
#include "test_util.h"

namespace qkv {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// 420 problems x 3 paths = 1,260 comparisons with the reference.
TEST(FusedForward, MatchesReferenceOnRandomProblemsOnEveryPath) {
  test::Rng rng("FusedForward.MatchesReference");
  const std::vector<Simd> paths = test::available_paths();
  int compared = 0;
  for (int trial = 0; trial < 420; ++trial) {
    test::Problem p = test::random_problem(rng);
    const test::Expected want = test::reference_of(p);
    for (Simd simd : paths) {
      test::run_fused(p, simd, static_cast<int>(rng.uniform_int(1, 3)));
      const std::string failure = test::compare_to_reference(p, want);
      ASSERT_EQ(failure, "") << "trial " << trial << " path " << simd_path_name(simd) << ": " << p.describe;
      ++compared;
    }
  }
  EXPECT_GE(compared, 420 * static_cast<int>(paths.size()));
}

// Large rows (M = 1000 keys, D = 128), where per-block rescaling is exercised many times.
TEST(FusedForward, MatchesReferenceOnLongRows) {
  test::Rng rng("FusedForward.LongRows");
  for (Simd simd : test::available_paths()) {
    test::Problem p;
    p.shape = AttentionShape{1, 2, 1, 130, 1000, 128, 128};
    p.q = test::make_strided(rng, 1, 2, 130, 128, test::Layout::bnhd, true);
    p.k = test::make_strided(rng, 1, 1, 1000, 128, test::Layout::contiguous, true);
    p.v = test::make_strided(rng, 1, 1, 1000, 128, test::Layout::padded, true);
    p.out = test::make_strided(rng, 1, 2, 130, 128, test::Layout::contiguous, false);
    p.lse = Tensor<float>({1, 2, 130});
    p.options.scale = 0.3;  // sharper rows than 1/sqrt(D): the running max changes often
    const test::Expected want = test::reference_of(p);
    test::run_fused(p, simd, 2);
    EXPECT_EQ(test::compare_to_reference(p, want), "") << simd_path_name(simd);
  }
}

// V's rows are read in place when 64-byte aligned and copied into the kernel's aligned workspace
// otherwise (a misaligned load spans two cache lines); a copy shared by the tiles of a group. The
// sums and their order are the same either way, so the outputs are too, bit for bit.
TEST(FusedForward, ValuesAtAnyAlignmentGiveTheSameBits) {
  test::Rng rng("FusedForward.ValuesAlignment");
  for (int64_t dv : {64, 128}) {
    test::Problem p;
    p.shape = AttentionShape{2, 2, 1, 300, 700, 64, dv};
    p.q = test::make_strided(rng, 2, 2, 300, 64, test::Layout::contiguous, true);
    p.k = test::make_strided(rng, 2, 1, 700, 64, test::Layout::contiguous, true);
    p.v = test::make_strided(rng, 2, 1, 700, dv, test::Layout::contiguous, true);
    p.out = test::make_strided(rng, 2, 2, 300, dv, test::Layout::contiguous, false);
    p.lse = Tensor<float>({2, 2, 300});
    // The same values one float further on: every row misaligned.
    const int64_t n = p.v.storage.numel();
    Tensor<float> shifted({n + 1});
    std::copy(p.v.storage.data(), p.v.storage.data() + n, shifted.data() + 1);
    const std::array<int64_t, 4> shape{2, 1, 700, dv};
    const TensorView<float> misaligned(shifted.data() + 1, shape);
    ASSERT_NE(reinterpret_cast<std::uintptr_t>(misaligned.data()) % 64, 0u);
    for (Simd simd : test::available_paths()) {
      const int threads = static_cast<int>(rng.uniform_int(1, 3));
      test::run_fused(p, simd, threads);
      const std::vector<float> aligned_out(p.out.storage.data(), p.out.storage.data() + p.out.storage.numel());
      const TensorView<float> aligned_v = p.v.view;
      p.v.view = misaligned;
      test::run_fused(p, simd, threads);
      p.v.view = aligned_v;
      EXPECT_EQ(std::memcmp(aligned_out.data(), p.out.storage.data(), aligned_out.size() * sizeof(float)), 0)
          << simd_path_name(simd) << " Dv " << dv << " threads " << threads;
    }
  }
}

TEST(FusedForward, FullyMaskedRowsAreZeroOnEveryPath) {
  test::Rng rng("FusedForward.FullyMasked");
  Tensor<float> q = rng.normal32({2, 2, 70, 16}), k = rng.normal32({2, 2, 33, 16}), v = rng.normal32({2, 2, 33, 8});
  Tensor<uint8_t> keep({70, 33});
  for (int64_t i = 0; i < keep.numel(); ++i) keep[i] = (i / 33) % 3 != 1;  // every third row keeps nothing
  for (Simd simd : test::available_paths()) {
    AttentionOptions options;
    options.simd = simd;
    options.mask.key_lengths = {0, 33};
    options.mask.query_lengths = {70, 50};
    options.mask.keep = broadcast_mask(keep.cview(), 2, 2, 70, 33, "keep");
    Tensor<float> out({2, 2, 70, 8}), lse({2, 2, 70});
    attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 70; ++i) {
          const bool masked = b == 0 || i >= 50 || i % 3 == 1;
          const float l = lse.view()(b, h, i);
          if (masked) {
            EXPECT_EQ(l, -kInf) << simd_path_name(simd) << " row " << b << "," << h << "," << i;
            for (int64_t e = 0; e < 8; ++e) EXPECT_EQ(out.view()(b, h, i, e), 0.0f);
          } else {
            EXPECT_TRUE(std::isfinite(l)) << simd_path_name(simd) << " row " << b << "," << h << "," << i;
          }
        }
  }
}

// A NaN in q reaches only its own row; a NaN in v (or k) reaches only the rows whose band holds its
// key (here: causal, so the rows at or after it), even when it shares a block with other rows. In
// fp32 (D = 24), and in bf16 at D = 64, where the products run on AMX tiles if the CPU has them:
// N = 300 puts the NaNs in the third key block, after blocks that started O.
template <class T>
void expect_nan_reaches_only_its_rows(int64_t D) {
  test::Rng rng("FusedForward.Nan");
  const int64_t N = 300;
  Tensor<float> q = rng.normal32({1, 1, N, D}), k = rng.normal32({1, 1, N, D}), v = rng.normal32({1, 1, N, D});
  q[7 * D + 3] = kNaN;
  v[270 * D + 5] = kNaN;
  k[290 * D + 1] = kNaN;
  Tensor<T> qt({1, 1, N, D}), kt({1, 1, N, D}), vt({1, 1, N, D});
  for (int64_t i = 0; i < q.numel(); ++i) {
    if constexpr (std::is_same_v<T, bf16>) {
      qt[i] = float_to_bf16(q[i]), kt[i] = float_to_bf16(k[i]), vt[i] = float_to_bf16(v[i]);
    } else {
      qt[i] = q[i], kt[i] = k[i], vt[i] = v[i];
    }
  }
  for (Simd simd : test::available_paths()) {
    AttentionOptions options;
    options.simd = simd;
    options.mask.causal = CausalAlign::top_left;
    Tensor<float> out({1, 1, N, D}), lse({1, 1, N});
    attention_forward(out.view(), lse.view(), qt.cview(), kt.cview(), vt.cview(), options);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t e = 0; e < D; ++e) {
        const bool poisoned = i == 7 || i >= 290 || (i >= 270 && e == 5);  // v poisons one column
        ASSERT_EQ(std::isnan(out[i * D + e]), poisoned)
            << simd_path_name(simd) << " D " << D << " row " << i << " col " << e;
      }
    }
    EXPECT_TRUE(std::isnan(lse[7]));
    EXPECT_TRUE(std::isfinite(lse[269]));
  }
}

TEST(FusedForward, NanReachesOnlyTheRowsThatUseIt) { expect_nan_reaches_only_its_rows<float>(24); }
TEST(FusedForward, NanReachesOnlyTheRowsThatUseItInBf16Tiles) { expect_nan_reaches_only_its_rows<bf16>(64); }

// Finite inputs whose scores (q · 1e20) or P·V sums (v near FLT_MAX) overflow fp32 were returned
// as NaN or inf; now refused on every path, while the float64 reference computes them, and NaN
// inputs still flow through (the test above).
TEST(FusedForward, RefusesAnOverflowFromFiniteInputs) {
  test::Rng rng("FusedForward.Overflow");
  const int64_t N = 4, D = 8;
  Tensor<float> q({1, 1, N, D}), k({1, 1, N, D}), v = rng.normal32({1, 1, N, D});
  // Equal scores: the unnormalised P·V sum is N·3e38 whatever the draw (with random scores one
  // key could dominate, and then the sum, and the result, stays finite: a flaky test).
  // k_neg: every score -1e40·D, -inf in fp32, so each row looked fully masked and came out 0
  // (the float64 reference gives mean(v)); it is the same overflow, below instead of above.
  Tensor<float> zero({1, 1, N, D}), huge_v({1, 1, N, D}), k_neg({1, 1, N, D});
  for (int64_t i = 0; i < q.numel(); ++i) {
    q[i] = 1e20f;
    k[i] = i / D == 1 ? -1e20f : 1e20f;
    k_neg[i] = -1e20f;
    huge_v[i] = 3e38f;
    zero[i] = 0.0f;
  }
  for (Simd simd : test::available_paths()) {
    AttentionOptions options;
    options.simd = simd;
    Tensor<float> out({1, 1, N, D});
    for (const auto& [qq, kk, vv] :
         {std::tuple{&q, &k, &v}, std::tuple{&zero, &zero, &huge_v}, std::tuple{&q, &k_neg, &v}}) {
      options.kernel = Kernel::fused;
      try {
        attention_forward(out.view(), {}, qq->cview(), kk->cview(), vv->cview(), options);
        ADD_FAILURE() << simd_path_name(simd) << ": an overflow was returned ("
                      << (kk == &k       ? "scores of 1e40"
                          : kk == &k_neg ? "scores of -1e40"
                                         : "v of 3e38")
                      << ")";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("the output overflowed float32 although q, k and v are finite"),
                  std::string::npos)
            << e.what();
      }
      options.kernel = Kernel::reference;
      attention_forward(out.view(), {}, qq->cview(), kk->cview(), vv->cview(), options);
      for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(out[i])) << i;
    }
  }
}

TEST(FusedForward, ReferenceKernelIsSelectable) {
  test::Rng rng("FusedForward.ReferenceSelectable");
  test::Problem p = test::random_problem(rng, 2e5);
  const test::Expected want = test::reference_of(p);
  AttentionOptions options = p.options;
  options.kernel = Kernel::reference;
  attention_forward(p.out.view, p.lse.view(), TensorView<const float>(p.q.view), TensorView<const float>(p.k.view),
                    TensorView<const float>(p.v.view), options);
  // The reference path rounds the float64 result once: within 1e-6 relative.
  EXPECT_EQ(test::compare_to_reference(p, want, 1e-6), "") << p.describe;
}

// A window bound of INT64_MAX means "unbounded on that side" on every path; d + right + 1 used to
// overflow, so `--window 0,9223372036854775807` returned zeros.
TEST(FusedForward, HugeWindowBoundsMeanUnbounded) {
  test::Rng rng("FusedForward.HugeWindow");
  const int64_t N = 37, M = 53, D = 16;
  Tensor<float> q = rng.normal32({1, 2, N, D}), k = rng.normal32({1, 2, M, D}), v = rng.normal32({1, 2, M, D});
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  const std::pair<Window, Window> same[] = {
      {{0, kHuge}, {0, -1}}, {{kHuge, 0}, {-1, 0}}, {{kHuge, kHuge}, {-1, -1}}, {{kHuge - 1, 3}, {-1, 3}}};
  for (const CausalAlign align : {CausalAlign::top_left, CausalAlign::bottom_right})
    for (const Kernel kernel : {Kernel::fused, Kernel::reference})
      for (const auto& [huge, plain] : same) {
        Tensor<float> got({1, 2, N, D}), want({1, 2, N, D});
        AttentionOptions options;
        options.kernel = kernel;
        options.mask.diagonal = align;
        options.mask.window = huge;
        attention_forward(got.view(), {}, q.cview(), k.cview(), v.cview(), options);
        options.mask.window = plain;
        attention_forward(want.view(), {}, q.cview(), k.cview(), v.cview(), options);
        for (int64_t i = 0; i < got.numel(); ++i)
          ASSERT_EQ(got[i], want[i]) << "window {" << huge.left << ", " << huge.right << "} element " << i;
      }
}

TEST(FusedForward, RejectsABadOutputShape) {
  Tensor<float> q({1, 1, 3, 4}), k({1, 1, 3, 4}), v({1, 1, 3, 4}), out({1, 1, 3, 5});
  try {
    attention_forward(out.view(), {}, q.cview(), k.cview(), v.cview());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "out: shape [1, 1, 3, 5] must be [1, 1, 3, 4]");
  }
}

TEST(Dispatch, AutomaticPicksTheBestPathTheCpuHas) {
  const kernels::CpuFeatures& f = kernels::cpu_features();
  const std::string best = f.avx512 ? "avx512" : f.avx2_fma ? "avx2" : f.neon ? "neon" : "scalar";
  if (std::getenv("QKV_SIMD") == nullptr) {
    EXPECT_EQ(simd_path_name(), best);
  }
  EXPECT_STREQ(simd_path_name(Simd::scalar), "scalar");
}

// One parser for the CLI, Python and QKV_SIMD: "auto" means automatic everywhere (QKV_SIMD=auto
// used to be refused while the CLI and Python said "auto").
TEST(Dispatch, ParsesTheNamesUsersType) {
  EXPECT_EQ(parse_simd("avx2", "QKV_SIMD"), Simd::avx2);
  EXPECT_EQ(parse_simd("scalar", "QKV_SIMD"), Simd::scalar);
  EXPECT_EQ(parse_simd("auto", "QKV_SIMD"), Simd::automatic);
  EXPECT_EQ(parse_simd("automatic", "QKV_SIMD"), Simd::automatic);
  EXPECT_EQ(parse_kernel("auto"), Kernel::automatic);
  EXPECT_EQ(parse_kernel("fused"), Kernel::fused);
  for (Simd s : {Simd::automatic, Simd::avx512, Simd::avx2, Simd::neon, Simd::scalar})
    EXPECT_EQ(parse_simd(simd_name(s)), s);
  for (Kernel k : {Kernel::automatic, Kernel::reference, Kernel::fused}) EXPECT_EQ(parse_kernel(kernel_name(k)), k);
  try {
    parse_simd("sse9", "QKV_SIMD");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "QKV_SIMD must be 'auto', 'avx512', 'avx2', 'neon' or 'scalar', got 'sse9'");
  }
  try {
    parse_kernel("gpu", "--kernel");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--kernel must be 'auto', 'reference' or 'fused', got 'gpu'");
  }
}

// 2^x of every path against float64 over the range the kernels use, (-inf, 0].
TEST(Exp2, IsAccurateToTwoUlp) {
  test::Rng rng("Exp2.IsAccurate");
  std::vector<float> x(200000), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = i < 100000 ? -static_cast<float>(i) / 100000.0f : static_cast<float>(rng.uniform(-126, 0));
  for (Simd simd : test::available_paths()) {
    const kernels::Exp2Fn fn = kernels::kernel_family(simd).exp2;
    fn(x.data(), y.data(), static_cast<int64_t>(x.size()));
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp2(static_cast<double>(x[i]));
      const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
      worst = std::max(worst, std::abs(y[i] - want) / ulp);
    }
    EXPECT_LE(worst, 2.0) << simd_path_name(simd);
    std::printf("exp2 %s: max error %.2f ulp on [-126, 0]\n", simd_path_name(simd), worst);
    const float special[3] = {-kInf, kNaN, 0.0f};
    float got[3];
    fn(special, got, 3);
    EXPECT_EQ(got[0], 0.0f);
    EXPECT_TRUE(std::isnan(got[1]));
    EXPECT_EQ(got[2], 1.0f);
  }
}

// Softcap's cap·tanh(x/cap) and its derivative 1 − tanh² (kernels/softcap.h, what every fused
// path and the decode use) against long double, over magnitudes 2^-40..2^20 of the cap and caps
// from 1e-3 to 3e38; the vectorized block gives the single call's bits; specials.
TEST(Softcap, IsRoundedOnceAndTheBlockMatchesTheCall) {
  test::Rng rng("Softcap.IsAccurate");
  for (const float cap : {1e-3f, 1.0f, 5.0f, 30.0f, 50.0f, 1e30f, 3e38f}) {
    std::vector<float> x(30000);
    for (float& xi : x) {
      const double magnitude = std::ldexp(1.0, static_cast<int>(rng.uniform_int(-40, 20)));
      xi = static_cast<float>(std::clamp(cap * magnitude * rng.uniform(-1, 1), -3.4e38, 3.4e38));
    }
    std::vector<float> y = x, slope(x.size());
    detail::softcap_scores(y.data(), slope.data(), static_cast<int64_t>(y.size()), cap);
    double worst = 0, worst_slope = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float one = detail::softcap_score(x[i], cap), one_slope = detail::softcap_slope(x[i], cap);
      ASSERT_EQ(std::memcmp(&one, &y[i], 4), 0) << "x " << x[i] << " cap " << cap;
      ASSERT_EQ(std::memcmp(&one_slope, &slope[i], 4), 0) << "x " << x[i] << " cap " << cap;
      const long double t = static_cast<long double>(x[i]) / cap, c = std::cosh(t);
      const long double want = cap * std::tanh(t), want_slope = 1 / (c * c);
      // ulps of fp32 at the wanted value (subnormal spacing below FLT_MIN)
      auto ulps = [](float got, long double w) {
        const double ulp = std::ldexp(1.0, std::max(std::ilogb(static_cast<double>(w)), -126) - 23);
        return w == 0 ? (got == 0 ? 0.0 : 1e9) : static_cast<double>(std::fabs(got - w)) / ulp;
      };
      worst = std::max(worst, ulps(y[i], want));
      if (want_slope >= 1e-37L) worst_slope = std::max(worst_slope, ulps(slope[i], want_slope));
    }
    std::printf("softcap %g: max error %.2f ulp, derivative %.2f ulp\n", cap, worst, worst_slope);
    // Rounded once from double: half an ulp, and a hair more where the double steps land near a tie.
    EXPECT_LE(worst, 0.6) << "cap " << cap;
    EXPECT_LE(worst_slope, 0.6) << "cap " << cap;
    // The double form, for refined scores with their low parts: to a few units of double's 2^-53.
    double worst_wide = 0, worst_wide_slope = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double xd = static_cast<double>(x[i]) * (1 + rng.uniform(-1e-9, 1e-9));
      const detail::SoftcapWide w = detail::softcap_wide(xd, cap);
      const long double t = static_cast<long double>(xd) / cap, c = std::cosh(t);
      const long double want = cap * std::tanh(t), want_slope = 1 / (c * c);
      if (want != 0) worst_wide = std::max(worst_wide, static_cast<double>(std::fabs((w.value - want) / want)));
      // Rounded to fp32 where used (the backward's dcap). sech² has condition number ~2|t|: the
      // one rounding of |x|·2/cap moves it by |t|·2^-52 relative.
      if (want_slope >= 1e-37L)
        worst_wide_slope = std::max(
            worst_wide_slope, static_cast<double>(std::fabs((w.slope - want_slope) / want_slope) / (1 + std::fabs(t))));
    }
    std::printf("softcap %g, double form: max relative error %.2g, derivative %.2g·(1 + |x/cap|)\n", cap, worst_wide,
                worst_wide_slope);
    EXPECT_LE(worst_wide, 2e-15) << "cap " << cap;
    EXPECT_LE(worst_wide_slope, 2e-15) << "cap " << cap;
    float special[6] = {0.0f, -0.0f, kInf, -kInf, kNaN, 1e-45f};
    float special_slope[6];
    detail::softcap_scores(special, special_slope, 6, cap);
    EXPECT_EQ(std::bit_cast<uint32_t>(special[0]), 0u);
    EXPECT_EQ(std::bit_cast<uint32_t>(special[1]), 0x80000000u);
    EXPECT_EQ(special[2], cap);
    EXPECT_EQ(special[3], -cap);
    EXPECT_TRUE(std::isnan(special[4]));
    EXPECT_TRUE(std::isnan(special_slope[4]));
    EXPECT_EQ(special_slope[0], 1.0f);
    EXPECT_EQ(special_slope[2], 0.0f);
  }
}

}  // namespace
}  // namespace qkv
