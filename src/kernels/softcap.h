// Softcap, cap·tanh(x/cap), on fp32 scores: the kernels' definition of it (MaskEval::adjust for
// float calls softcap_score; the float64 reference keeps std::tanh).
//
// Why not std::tanh: at ~40 ns a score it made a softcapped forward 14× slower than the same
// forward without (TESTING.md, "Round 14"). This is branch-free double arithmetic that GCC
// vectorizes inside each SIMD family's source (softcap_scores), and a single call gives the same
// bits as the vectorized loop: the same IEEE operations in the same order, with no FMA
// contraction in ISO C++ mode (CMAKE_CXX_EXTENSIONS OFF).
//
// Through e = expm1(2|x|/cap): tanh = e/(e + 2) keeps its relative accuracy near 0, where
// 1 − 2/(e^{2x} + 1) would lose cap·1e-7, and softcap's derivative 1 − tanh² = 4(e + 1)/(e + 2)²
// does not cancel where tanh saturates (the backward's dcap). Each result is rounded to fp32 once;
// the double steps add < 1e-9 relative.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace qkv::detail {

// expm1(y) for y in [0, 700] (NaN stays NaN): y = k·ln 2 + r with |r| ≤ ln 2 / 2, so
// expm1(y) = 2^k·expm1(r) + (2^k − 1), both terms of one sign when k ≥ 1. expm1(r) by its Taylor
// series to r^8 (truncation < 2e-10 relative on |r| ≤ 0.347).
inline double softcap_expm1(double y) {
  constexpr double kLog2e = 1.4426950408889634, kLn2 = 0.6931471805599453;
  constexpr double kRound = 0x1.8p52;  // y·log2e + kRound holds round(y·log2e) in its low bits
  const double shifted = y * kLog2e + kRound;
  const double k = shifted - kRound;
  const double r = y - k * kLn2;
  double p = 1.0 / 40320;
  p = p * r + 1.0 / 5040;
  p = p * r + 1.0 / 720;
  p = p * r + 1.0 / 120;
  p = p * r + 1.0 / 24;
  p = p * r + 1.0 / 6;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r;
  // 2^k from k's bits (0 ≤ k ≤ 1010): the shift drops kRound's bits and leaves k in the exponent.
  const double scale = std::bit_cast<double>((std::bit_cast<uint64_t>(shifted) << 52) + std::bit_cast<uint64_t>(1.0));
  return scale * p + (scale - 1.0);
}

// The argument of softcap_e: 2/cap, and the bits of the |x| past which y is 700 (350·cap, or the
// largest float where that overflows, which is then below 350·cap).
struct SoftcapArg {
  explicit SoftcapArg(float cap)
      : two_over_cap(2.0 / cap), clamp_bits(std::min(std::bit_cast<uint32_t>(350.0f * cap), 0x7f7fffffu)) {}
  double two_over_cap;
  int64_t clamp_bits;
};

// e = expm1(y), y = 2|x|/cap clamped at 700: there e ~ 1e304, so tanh = e/(e + 2) is 1 and
// (e + 2)² overflows to make the derivative 0, as they are in double from y ~ 40 and ~ 710 on;
// past 700 the 2^k of softcap_expm1 would leave double's range. NaN stays NaN; ±inf gives ±cap.
// The clamp is integer masks on 64-bit lanes: with a float compare, or a select, GCC moved the
// conversion into a branch ("could trap") and vectorized nothing for AVX2.
inline double softcap_e(float x, const SoftcapArg& a) {
  constexpr int64_t kAbs = 0x7fffffff, kInf = 0x7f800000, kLimit = std::bit_cast<int64_t>(700.0);
  const int64_t bits = std::bit_cast<uint32_t>(x) & kAbs;  // 64-bit lanes, as y's
  const int64_t y = std::bit_cast<int64_t>(std::fabs(static_cast<double>(x)) * a.two_over_cap);
  const int64_t clamp = -static_cast<int64_t>((bits > a.clamp_bits) & (bits <= kInf));  // all ones or 0
  return softcap_expm1(std::bit_cast<double>((kLimit & clamp) | (y & ~clamp)));
}

// cap·tanh(x/cap) and 1 − tanh²(x/cap) from e, each rounded once to fp32.
inline float softcap_value(float x, double e, float cap) {
  return static_cast<float>(std::copysign(static_cast<double>(cap) * (e / (e + 2.0)), static_cast<double>(x)));
}
inline float softcap_derivative(double e) { return static_cast<float>(4.0 * (e + 1.0) / ((e + 2.0) * (e + 2.0))); }

inline float softcap_score(float x, float cap) { return softcap_value(x, softcap_e(x, SoftcapArg(cap)), cap); }
inline float softcap_slope(float x, float cap) { return softcap_derivative(softcap_e(x, SoftcapArg(cap))); }

// s[0, n) = softcap_score(s[·], cap), and slope[0, n) = softcap_slope(s[·], cap) unless null: one
// loop for the compiler to vectorize in the calling family's target, with the calls' bits.
inline void softcap_scores(float* s, float* slope, int64_t n, float cap) {
  const SoftcapArg arg(cap);
  if (slope == nullptr) {
    for (int64_t j = 0; j < n; ++j) s[j] = softcap_value(s[j], softcap_e(s[j], arg), cap);
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const float x = s[j];
    const double e = softcap_e(x, arg);
    slope[j] = softcap_derivative(e);
    s[j] = softcap_value(x, e, cap);
  }
}

}  // namespace qkv::detail
