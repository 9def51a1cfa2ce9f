// log(x) in float64 for several rows per register: the forward's lse is m + log(l) for every query
// row, and glibc's scalar log, one row at a time, took 2.6% of a forward at N = 128 (perf, Zen 5).
// Written with GCC vectors of any width (the family's), so every family builds it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/register_vectors.h"

namespace qkv::kernels {
namespace {  // each family's translation unit keeps its own copy, built for its instruction set

// x = log(x) for positive normal x, within 2 ulp of float64 (tests/row_log_test.cpp): x = 2^k · f with
// f in [√½, √2), log f = 2·atanh(s) with s = (f − 1)/(f + 1), |s| ≤ 0.1716, whose series to s^21
// leaves under 2^-54. k·ln2 is split so that its high part is exact for any k of a double.
template <int Lanes>
[[gnu::always_inline]] inline void log_normal(typename RegisterVector<double, Lanes>::type& x) {
  using D = typename RegisterVector<double, Lanes>::type;
  using I = typename RegisterVector<int64_t, Lanes>::type;
  constexpr int64_t kSqrtHalf = 0x3fe6a09e667f3bcd;  // the bits of √½
  const I bits = reinterpret_cast<I>(x);
  const I k = (bits - kSqrtHalf) >> 52;  // x's binary exponent, one more where f would pass √2
  const D f = reinterpret_cast<D>(bits - (k << 52));
  const D s = (f - 1.0) / (f + 1.0);
  const D z = s * s;
  D p = z * (1.0 / 21);
  for (const double c : {1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3})
    p = z * (p + c);
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const D kd = __builtin_convertvector(k, D);
  x = kd * kLn2Hi + (kd * kLn2Lo + (2.0 * s + 2.0 * s * p));
}

// out[r] = log(x[r]) for r < n; NaN, infinities, zeros, negatives and subnormals get std::log's.
template <int Lanes>
void log_rows(const float* x, double* out, int64_t n) {
  using D = typename RegisterVector<double, Lanes>::type;
  using F = typename RegisterVector<float, Lanes>::type;
  for (int64_t r0 = 0; r0 < n; r0 += Lanes) {
    F xf;
    if (r0 + Lanes <= n) {
      std::memcpy(&xf, x + r0, sizeof xf);
    } else {
      for (int j = 0; j < Lanes; ++j) xf[j] = r0 + j < n ? x[r0 + j] : 1.0f;
    }
    D v;
    widen_floats(xf, v);
    D y = v;
    log_normal<Lanes>(y);
    for (int j = 0; j < Lanes; ++j)
      if (!(v[j] >= 0x1p-1022 && v[j] <= 0x1p1023)) y[j] = std::log(v[j]);  // NaN fails both tests
    std::memcpy(out + r0, &y, static_cast<std::size_t>(std::min<int64_t>(Lanes, n - r0)) * sizeof(double));
  }
}

}  // namespace
}  // namespace qkv::kernels
