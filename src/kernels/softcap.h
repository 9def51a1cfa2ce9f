// Softcap, cap·tanh(x/cap), on fp32 scores: the kernels' definition of it (MaskEval::adjust for
// float calls softcap_score; the float64 reference keeps std::tanh).
//
// Why not std::tanh: at ~50 ns a score it made a softcapped forward 14× slower than the same
// forward without (measured). This is branch-free double arithmetic
// that GCC vectorizes inside each SIMD family's source (softcap_scores), and a single call gives
// the same bits as the vectorized loop: the same operations in the same order, which GCC contracts
// into FMAs alike where the target has them (the Softcap test checks it on x86's baseline and, with
// FMA, on NEON under qemu). Different families may differ in the last bit; a family's forward and
// backward run the same code on the same scores.
//
// Through e = expm1(2|x|/cap): tanh = e/(e + 2) keeps its relative accuracy near 0, where
// 1 − 2/(e^{2x} + 1) would lose cap·1e-7, and softcap's derivative 1 − tanh² = 4(e + 1)/(e + 2)²
// does not cancel where tanh saturates (the backward's dcap). Each result is rounded to fp32 once;
// the double steps add < 1e-9 relative.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace qkv::detail {

// 1/n! for expm1's Taylor series.
inline constexpr double kInvFactorial[14] = {
    1.0,        1.0,         1.0 / 2,      1.0 / 6,       1.0 / 24,       1.0 / 120,       1.0 / 720,
    1.0 / 5040, 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800};

// expm1(y) for y in [0, 700] (NaN stays NaN): y = k·ln 2 + r with |r| ≤ ln 2 / 2 (ln 2 in two
// parts, so k·ln2_hi is exact), expm1(y) = 2^k·expm1(r) + (2^k − 1), both terms of one sign when
// k ≥ 1; expm1(r) by its Taylor series to r^Degree. Degree 8 (truncation < 2e-10 relative on
// |r| ≤ 0.347) for results rounded to fp32; 13 (< 5e-18) where the double itself is kept.
template <int Degree>
double softcap_expm1(double y) {
  constexpr double kLog2e = 1.4426950408889634, kLn2Hi = 0x1.62e42feep-1, kLn2Lo = 0x1.a39ef35793c76p-33;
  constexpr double kRound = 0x1.8p52;  // y·log2e + kRound holds round(y·log2e) in its low bits
  const double shifted = y * kLog2e + kRound;
  const double k = shifted - kRound;
  const double r = (y - k * kLn2Hi) - k * kLn2Lo;
  double p = kInvFactorial[Degree];
  for (int n = Degree - 1; n >= 1; --n) p = p * r + kInvFactorial[n];
  p = p * r;
  // 2^k from k's bits (0 ≤ k ≤ 1010): the shift drops kRound's bits and leaves k in the exponent.
  const double scale = std::bit_cast<double>((std::bit_cast<uint64_t>(shifted) << 52) + std::bit_cast<uint64_t>(1.0));
  return scale * p + (scale - 1.0);
}

// y clamped at 700: there e = expm1(y) ~ 1e304, so tanh = e/(e + 2) is 1 and (e + 2)² overflows
// to make the derivative 0, as they are in double from y ~ 40 and ~ 355 on; past 700 the 2^k of
// softcap_expm1 would leave double's range. NaN stays NaN, +inf becomes 700. Integer masks on
// y's bits (y ≥ 0): with a float compare, or a select, GCC moved the arithmetic into a branch
// ("could trap") and vectorized nothing for AVX2.
inline double softcap_clamp(double y) {
  constexpr int64_t kLimit = std::bit_cast<int64_t>(700.0), kInf = std::bit_cast<int64_t>(HUGE_VAL);
  const int64_t bits = std::bit_cast<int64_t>(y);
  const int64_t clamp = -static_cast<int64_t>((bits > kLimit) & (bits <= kInf));  // all ones or 0
  return std::bit_cast<double>((kLimit & clamp) | (bits & ~clamp));
}

// e = expm1(2|x|/cap) for an fp32 score; two_over_cap = 2/cap in double (finite for any cap > 0).
inline double softcap_e(float x, double two_over_cap) {
  return softcap_expm1<8>(softcap_clamp(std::fabs(static_cast<double>(x)) * two_over_cap));
}

// cap·tanh(x/cap) and 1 − tanh²(x/cap) from e in double, and each rounded once to fp32.
inline double softcap_value_wide(double x, double e, double cap) { return std::copysign(cap * (e / (e + 2.0)), x); }
inline double softcap_derivative_wide(double e) { return 4.0 * (e + 1.0) / ((e + 2.0) * (e + 2.0)); }
inline float softcap_value(float x, double e, float cap) {
  return static_cast<float>(softcap_value_wide(static_cast<double>(x), e, static_cast<double>(cap)));
}
inline float softcap_derivative(double e) { return static_cast<float>(softcap_derivative_wide(e)); }

inline float softcap_score(float x, float cap) { return softcap_value(x, softcap_e(x, 2.0 / cap), cap); }
inline float softcap_slope(float x, float cap) { return softcap_derivative(softcap_e(x, 2.0 / cap)); }

// cap·tanh(x/cap) of a double x (a refined score with its low part, large_scores.h) to double's
// accuracy (~1e-15 relative), and 1 − tanh²(x/cap): one score at a time.
struct SoftcapWide {
  double value, slope;
};
inline SoftcapWide softcap_wide(double x, double cap) {
  const double e = softcap_expm1<13>(softcap_clamp(std::fabs(x) * (2.0 / cap)));
  return {softcap_value_wide(x, e, cap), softcap_derivative_wide(e)};
}

// s[0, n) = softcap_score(s[·], cap), and slope[0, n) = softcap_slope(s[·], cap) unless null: one
// loop for the compiler to vectorize in the calling family's target, with the calls' bits.
inline void softcap_scores(float* s, float* slope, int64_t n, float cap) {
  const double two_over_cap = 2.0 / cap;
  if (slope == nullptr) {
    for (int64_t j = 0; j < n; ++j) s[j] = softcap_value(s[j], softcap_e(s[j], two_over_cap), cap);
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const float x = s[j];
    const double e = softcap_e(x, two_over_cap);
    slope[j] = softcap_derivative(e);
    s[j] = softcap_value(x, e, cap);
  }
}

}  // namespace qkv::detail
