// Every AVX2 + FMA vector operation of the kernels (8 fp32 lanes): the forward's and backward's
// Avx2, and the decode widening loads and reductions. This folder is compiled for AVX2, FMA and
// F16C (src/kernels/CMakeLists.txt); the library around it stays baseline.
#pragma once

#include "kernels/kernel_deps.h"

namespace qkv::kernels {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kRegisters = 16;  // ymm0-15
  // Micro-tile: 6 rows x 2 vectors = 12 accumulators + 2 B vectors + 1 broadcast of the 16 registers.
  static constexpr int kRows = 6, kVecs = 2;
  static constexpr int kKeyBlock = 64;

  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  // a > b ? a : b (the x86 MAXPS rule: a NaN in `a` is dropped, a NaN in `b` kept).
  static V max(V a, V b) { return _mm256_max_ps(a, b); }

  // 2^x for x <= 0: as Avx512::exp2, but 2^n is built in the exponent field, so results below
  // 2^-126 (x < -126.5) flush to 0 (absolute error < 2^-126). Max error 2 ulp on [-126, 0].
  static V exp2(V x) {
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);  // NaN is the second operand: kept
    // y = x + 1.5·2^23 holds n = round(x) (to nearest even, as vroundps) in its low mantissa bits,
    // an add and a sub where vroundps + vcvtps2dq took 3 uops of the FMA ports.
    const V big = _mm256_set1_ps(12582912.0f);
    const V y = _mm256_add_ps(x, big);
    const V f = _mm256_sub_ps(x, _mm256_sub_ps(y, big));
    // 2^n before the polynomial, so y is dead while the polynomial's constants fill the 16
    // registers (computed after it, n was spilled to the stack in the softmax loop). y's bits are
    // 0x4B400000 + n: adding 127 and shifting by 23 leaves (n + 127) << 23; n = -127 gives
    // exponent field 0, i.e. the factor 0.
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(127)), 23);
    V p = _mm256_set1_ps(kExp2Poly[0]);
    for (std::size_t i = 1; i < std::size(kExp2Poly); ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }

  static V band_mask(V s, V j, V lo, V hi) {
    const V in = _mm256_and_ps(_mm256_cmp_ps(lo, j, _CMP_LE_OQ), _mm256_cmp_ps(j, hi, _CMP_LT_OQ));
    return _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), s, in);
  }
  static V neg_inf_to_zero(V m) {
    const V ninf = _mm256_cmp_ps(m, _mm256_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    return _mm256_blendv_ps(m, _mm256_setzero_ps(), ninf);
  }
  // dst[c * ld_dst + r] = src[r * ld_src + c] for an 8 x 8 block whose first `rows` rows exist
  // (the others read as 0; rows <= 0 reads nothing), as Avx512::transpose: packing Q with strided
  // scalar loads took one element per ~2 cycles, 8.7% of S2's forward on Zen 3.
  static constexpr int kTranspose = 8;
  static void transpose(const float* src, int64_t ld_src, int64_t rows, float* dst, int64_t ld_dst) {
    V r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_loadu_ps(src + i * ld_src) : _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {  // rows 2i, 2i+1 interleaved: columns 0, 1 | 4, 5 and 2, 3 | 6, 7
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {  // r[4i + c]: column c | c + 4 of rows 4i..4i+3
      r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; ++c) {
      _mm256_storeu_ps(dst + c * ld_dst, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
      _mm256_storeu_ps(dst + (c + 4) * ld_dst, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
    }
  }
  static bool any_nan(V x) { return _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0; }
  // Bit i: a[i] >= b[i].
  static uint32_t ge_mask(V a, V b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GE_OQ)); }
};

// The decode kernel's operations besides Avx2's: horizontal sums and maxima, the transposing
// reduction, and the widening loads of each storage type.
struct Avx2Decode : Avx2 {
  static float hsum(V x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  static float hmax(V x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  // Lane j of the result = the sum of the lanes of a[j], j < 8 (as Avx512Decode::reduce_lanes).
  static V reduce_lanes(const V* a) {
    V c[4], d[2];
    for (int i = 0; i < 4; ++i)
      c[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; ++i)
      d[i] = _mm256_add_ps(_mm256_shuffle_ps(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm256_shuffle_ps(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_permute2f128_ps(d[0], d[1], 0x20), _mm256_permute2f128_ps(d[0], d[1], 0x31));
  }
  // An opaque use of x, so GCC keeps it in a register: it otherwise folds a q vector of the
  // decode scores into each of its FMAs as a memory operand (10 loads per 8 FMAs); held once,
  // Zen 3's D1 steps took 2-6% less time (f16 hot 644 → 596-610 µs).
  static void keep_in_register(V& x) { asm("" : "+x"(x)); }
  static V load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V load_bf16(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static V load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};

}  // namespace
}  // namespace qkv::kernels
