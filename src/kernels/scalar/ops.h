// The portable one-lane "vector" operations of the kernels, decode's included: the same
// algorithm as the SIMD families, compiled for the baseline ISA, so the library runs on any CPU
// (and is the path to compare the others against when a SIMD family is in doubt).
#pragma once

#include "core/kv_codec.h"
#include "kernels/kernel_deps.h"

namespace qkv::kernels {
namespace {

struct Scalar {
  using V = float;
  static constexpr int kLanes = 1;
  static constexpr int kRegisters = 16;  // x86-64's xmm0-15, the fewer of the two hosts
  static constexpr int kRows = 4, kVecs = 4;
  static constexpr int kKeyBlock = 64;

  static V zero() { return 0.0f; }
  static V set1(float x) { return x; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V x) { *p = x; }
  // One rounding per term, as the SIMD families' FMA. Plain a * b + c rounds twice, and with
  // scores of ~100 that doubled the error of S = q·k and took dk to 6× FlashAttention's rule where
  // the SIMD paths stay at 3×. Without FMA hardware std::fma is a slow library call, so there the
  // product is taken in double, where it is exact, and only the sum rounds (double, then float:
  // unlike a fused a·b + c only on rare ties). That costs the scalar forward ~30%.
  static V fma(V a, V b, V c) {
#ifdef FP_FAST_FMAF
    return std::fma(a, b, c);
#else
    return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) + static_cast<double>(c));
#endif
  }
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  // a > b ? a : b, the same NaN rule as x86 MAXPS.
  static V max(V a, V b) { return a > b ? a : b; }
  // libm's exp2f: within 1 ulp; 2^-inf = 0; NaN stays NaN.
  static V exp2(V x) { return std::exp2(x); }
  static V band_mask(V s, V j, V lo, V hi) { return lo <= j && j < hi ? s : -std::numeric_limits<float>::infinity(); }
  static V neg_inf_to_zero(V m) { return m == -std::numeric_limits<float>::infinity() ? 0.0f : m; }
  static constexpr int kTranspose = 0;  // Q and key tiles are packed by plain loops
  static bool any_nan(V x) { return std::isnan(x); }
  // Bit 0: a >= b.
  static uint32_t ge_mask(V a, V b) { return a >= b; }
};

// The decode kernel's operations besides Scalar's: horizontal sums and maxima, the transposing
// reduction, and the widening loads of each storage type.
struct ScalarDecode : Scalar {
  static float hsum(V x) { return x; }
  static float hmax(V x) { return x; }
  static V reduce_lanes(const V* a) { return a[0]; }
  static V load_f16(const uint16_t* p) { return detail::kv_decode_unscaled(KVDtype::f16, p, 0); }
  static V load_bf16(const uint16_t* p) { return detail::kv_decode_unscaled(KVDtype::bf16, p, 0); }
  static V load_i8(const int8_t* p) { return detail::kv_decode_unscaled(KVDtype::i8, p, 0); }
};

}  // namespace
}  // namespace qkv::kernels
