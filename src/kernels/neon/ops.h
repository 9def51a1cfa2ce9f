// Every NEON vector operation of the kernels (AArch64 Advanced SIMD, 4 fp32 lanes; every AArch64
// CPU has it, so the folder needs no compile option): the forward's and backward's Neon, and the
// decode widening loads and reductions.
#pragma once

#include "kernels/kernel_deps.h"

namespace qkv::kernels {
namespace {

struct Neon {
  using V = float32x4_t;
  static constexpr int kLanes = 4;
  static constexpr int kRegisters = 32;  // v0-v31
  // Micro-tile: 6 rows x 4 vectors = 24 accumulators of the 32 registers, leaving room for the
  // 4 B vectors and a broadcast. Not tuned: speed is not measurable under qemu.
  static constexpr int kRows = 6, kVecs = 4;
  static constexpr int kKeyBlock = 64;

  static V zero() { return vdupq_n_f32(0.0f); }
  static V set1(float x) { return vdupq_n_f32(x); }
  static V load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, V x) { vst1q_f32(p, x); }
  static V fma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
  static V mul(V a, V b) { return vmulq_f32(a, b); }
  static V add(V a, V b) { return vaddq_f32(a, b); }
  static V sub(V a, V b) { return vsubq_f32(a, b); }
  // a > b ? a : b, the x86 MAXPS rule the kernels rely on (a NaN in `a` is dropped, a NaN in `b`
  // kept); FMAX would return NaN for either.
  static V max(V a, V b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }

  // 2^x for x <= 0, as Avx2::exp2: n = round(x) (to nearest even), 2^f by kExp2Poly, 2^n built
  // in the exponent field, so results below 2^-126 flush to 0. NaN stays NaN.
  static V exp2(V x) {
    x = max(vdupq_n_f32(-127.0f), x);  // NaN is the second operand: kept
    const V n = vrndnq_f32(x);
    const V f = vsubq_f32(x, n);
    V p = vdupq_n_f32(kExp2Poly[0]);
    for (std::size_t i = 1; i < std::size(kExp2Poly); ++i) p = vfmaq_f32(vdupq_n_f32(kExp2Poly[i]), p, f);
    // n = -127 gives exponent field 0, i.e. the factor 0.
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
  }

  static V band_mask(V s, V j, V lo, V hi) {
    const uint32x4_t in = vandq_u32(vcleq_f32(lo, j), vcltq_f32(j, hi));
    return vbslq_f32(in, s, vdupq_n_f32(-std::numeric_limits<float>::infinity()));
  }
  static V neg_inf_to_zero(V m) {
    return vbslq_f32(vceqq_f32(m, vdupq_n_f32(-std::numeric_limits<float>::infinity())), vdupq_n_f32(0.0f), m);
  }
  static constexpr int kTranspose = 0;  // Q and key tiles are packed by plain loops
  // x == x is false only in NaN lanes.
  static bool any_nan(V x) { return vminvq_u32(vceqq_f32(x, x)) == 0; }
  // Bit i: a[i] >= b[i].
  static uint32_t ge_mask(V a, V b) {
    static constexpr uint32_t kBits[4] = {1, 2, 4, 8};
    return vaddvq_u32(vandq_u32(vcgeq_f32(a, b), vld1q_u32(kBits)));
  }
};

// The decode kernel's operations besides Neon's: horizontal sums and maxima, the transposing
// reduction, and the widening loads of each storage type.
struct NeonDecode : Neon {
  static float hsum(V x) { return vaddvq_f32(x); }
  static float hmax(V x) { return vmaxvq_f32(x); }
  // Lane j of the result = the sum of the lanes of a[j], j < 4: two rounds of pairwise adds.
  static V reduce_lanes(const V* a) { return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3])); }
  static V load_f16(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
  static V load_bf16(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
  static V load_i8(const int8_t* p) {
    int32_t four;
    std::memcpy(&four, p, sizeof four);  // exactly 4 bytes: the next page may not be there
    const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(four)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
  }
};

}  // namespace
}  // namespace qkv::kernels
