// Every AVX-512 vector operation of the kernels (16 fp32 lanes): the forward's and backward's
// Avx512, the bf16 pair products, AMX, and the decode widening loads and reductions. This folder
// is compiled for AVX-512 (src/kernels/CMakeLists.txt); the library around it stays baseline.
#pragma once

#include "kernels/amx_tiles.h"
#include "kernels/kernel_deps.h"

namespace qkv::kernels {
namespace {

// bf16 pairs for the micro-kernel (microkernel.h): each 32-bit element holds two bf16, and one
// vdpbf16ps adds both products of each lane to its fp32 accumulator.
struct Bf16PairDot {
  using V = __m512;
  using AT = uint32_t;
  using BT = uint32_t;
  static V bcast(const uint32_t* a) {
    uint32_t x;
    std::memcpy(&x, a, sizeof x);  // rows of a bf16 tensor may be only 2-byte aligned
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(x)));
  }
  static V load(const uint32_t* b) { return _mm512_castsi512_ps(_mm512_loadu_si512(b)); }
  static V madd(V a, V b, V acc) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }

  // dst[i] = pair(bf16(lo[i]), bf16(hi[i])) for the 16 lanes, rounded to nearest even (vcvtne2ps2bf16).
  static void round_pairs(V lo, V hi, uint32_t* dst) {
    // cvtne2ps puts lo's 16 bf16 below hi's; the permutation interleaves them into pairs.
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(order, both));
  }
  // dst[i] = pair(lo[i], hi[i]) for 16 i of two rows of bf16 bits (hi null: zeros).
  static void interleave(const uint16_t* lo, const uint16_t* hi, uint32_t* dst) {
    const __m512i l = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo)));
    const __m512i h = hi != nullptr ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)))
                                    : _mm512_setzero_si512();
    _mm512_storeu_si512(dst, _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
  }
};

// AMX-BF16 tile products for the bf16 forward where the CPU and OS have them (dispatch.cpp): on
// a Zen 4 (measured) vdpbf16ps issues once per 2 cycles, so its
// pairs multiply at half the rate of fp32 FMAs, while tdpbf16ps runs ~15x the FMA peak. Every tile
// is 16 rows x 64 bytes: tmm0-3 a 2x2 block of C, tmm4-5 two row blocks of A, tmm6-7 two column
// blocks of B. The results are deterministic (one fixed order per element), not those of
// vdpbf16ps; both flush subnormal inputs and outputs.
struct AmxBf16 {
  // Loads the tile configuration on this thread; end() releases the tile state.
  static void begin() { load_tile_config(); }
  static void end() { _tile_release(); }

  // C [rows x cols] = (accumulate ? C : 0) + A · B: A [rows x 2kp] bf16 rows lda bytes apart,
  // B [kp x cols] pairs (ldb elements apart), C fp32 (ldc apart). rows, cols, kp: multiples of 16.
  static void gemm(const void* a, int64_t lda, const uint32_t* b, int64_t ldb, float* c, int64_t ldc, int64_t rows,
                   int64_t cols, int64_t kp, bool accumulate) {
    const char* ab = static_cast<const char*>(a);
    for (int64_t r0 = 0; r0 < rows; r0 += 32) {
      const bool r2 = r0 + 16 < rows;
      for (int64_t c0 = 0; c0 < cols; c0 += 32) {
        const bool c2 = c0 + 16 < cols;
        float* cc = c + r0 * ldc + c0;
        const int64_t ldc_b = ldc * 4, down = 16 * ldc;
        if (accumulate) {
          _tile_loadd(0, cc, ldc_b);
          if (c2) _tile_loadd(1, cc + 16, ldc_b);
          if (r2) _tile_loadd(2, cc + down, ldc_b);
          if (r2 && c2) _tile_loadd(3, cc + down + 16, ldc_b);
        } else {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        }
        for (int64_t k0 = 0; k0 < kp; k0 += 16) {
          const char* ak = ab + r0 * lda + k0 * 4;
          const uint32_t* bk = b + k0 * ldb + c0;
          _tile_loadd(4, ak, lda);
          _tile_loadd(6, bk, ldb * 4);
          _tile_dpbf16ps(0, 4, 6);
          if (c2) {
            _tile_loadd(7, bk + 16, ldb * 4);
            _tile_dpbf16ps(1, 4, 7);
          }
          if (r2) {
            _tile_loadd(5, ak + 16 * lda, lda);
            _tile_dpbf16ps(2, 5, 6);
            if (c2) _tile_dpbf16ps(3, 5, 7);
          }
        }
        _tile_stored(0, cc, ldc_b);
        if (c2) _tile_stored(1, cc + 16, ldc_b);
        if (r2) _tile_stored(2, cc + down, ldc_b);
        if (r2 && c2) _tile_stored(3, cc + down + 16, ldc_b);
      }
    }
  }
};

struct Avx512 {
  using V = __m512;
  using PairDot = Bf16PairDot;
  using TileDot = AmxBf16;
  static constexpr int kLanes = 16;
  static constexpr int kRegisters = 32;  // zmm0-31
  // Micro-tile: 6 rows x 4 vectors = 24 accumulators of the 32 registers, leaving room for the
  // 4 B vectors; broadcasts of A fold into the FMAs as memory operands.
  static constexpr int kRows = 6, kVecs = 4;
  // Keys per block at most (buffers are sized for it): the bf16 forward's, and the fp32 forward's
  // where the CPU takes 128 (CpuFeatures::fp32_key_block); 128 measured 1-2% faster than 64 on
  // S2-S6 (fewer O rescales per key) on the class it was tuned on.
  static constexpr int kKeyBlock = 128;

  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  // a > b ? a : b, so a NaN in `a` is dropped and a NaN in `b` kept (the x86 MAXPS rule).
  static V max(V a, V b) { return _mm512_max_ps(a, b); }

  // 2^x for x <= 0 (the only range the kernels use): x = n + f with n = round(x), |f| <= 1/2;
  // 2^f by Cephes' degree-6 exp2f polynomial; 2^n applied exactly by vscalefps, which also
  // gives subnormals and 0 below -149. 2^-inf = 0; NaN stays NaN. Max error 2 ulp (measured by
  // Exp2.IsAccurate on [-126, 0]).
  static V exp2(V x) {
    x = _mm512_max_ps(_mm512_set1_ps(-160.0f), x);  // NaN is the second operand: kept
    const V n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = _mm512_sub_ps(x, n);
    V p = _mm512_set1_ps(kExp2Poly[0]);
    for (std::size_t i = 1; i < std::size(kExp2Poly); ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
    return _mm512_scalef_ps(p, n);
  }

  // Lanes with lo <= j < hi keep s; the others become -inf.
  static V band_mask(V s, V j, V lo, V hi) {
    const __mmask16 in = _mm512_cmp_ps_mask(lo, j, _CMP_LE_OQ) & _mm512_cmp_ps_mask(j, hi, _CMP_LT_OQ);
    return _mm512_mask_blend_ps(in, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), s);
  }
  static V neg_inf_to_zero(V m) {
    const __mmask16 ninf = _mm512_cmp_ps_mask(m, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(ninf, m, _mm512_setzero_ps());
  }
  static bool any_nan(V x) { return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0; }
  // Bit i: a[i] >= b[i].
  static uint32_t ge_mask(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  // x + p[i] in the lanes whose bit is set, x in the others, whose p[i] is not read.
  static V add_where(V x, uint32_t bits, const float* p) {
    const __mmask16 k = static_cast<__mmask16>(bits);
    return _mm512_mask_add_ps(x, k, x, _mm512_maskz_loadu_ps(k, p));
  }
  // out[0, popcount(bits)) = first + i for each set bit i, ascending; the whole vector is stored, so
  // out has room for kLanes. The register form of the compress: its store form is slow on Zen 4.
  static int append_lanes(uint32_t bits, int32_t first, uint32_t* out) {
    const __m512i lanes = _mm512_add_epi32(_mm512_set1_epi32(first),
                                           _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    _mm512_storeu_si512(out, _mm512_maskz_compress_epi32(static_cast<__mmask16>(bits), lanes));
    return std::popcount(bits);
  }

  // dst[c * ld_dst + r] = src[r * ld_src + c] for a kTranspose x kTranspose block whose first
  // `rows` rows exist (the others read as 0; rows <= 0 reads nothing): packing Q tiles costs ~0.4
  // instructions per element this way instead of ~2 for scalar gathers (6% of the time of many
  // short heads, S2). The bits move untouched (the bf16 forward transposes P's pairs this way).
  static constexpr int kTranspose = 16;
  static void transpose(const float* src, int64_t ld_src, int64_t rows, float* dst, int64_t ld_dst) {
    V r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(src + i * ld_src) : _mm512_setzero_ps();
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // r[4i + c] now holds columns c, c+4, c+8, c+12 of rows 4i..4i+3
      const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
      const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
      r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
      r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
      r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int c = 0; c < 4; ++c) {
      const V x0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), y0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
      const V x1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD), y1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
      store(dst + c * ld_dst, _mm512_shuffle_f32x4(x0, y0, 0x88));
      store(dst + (c + 8) * ld_dst, _mm512_shuffle_f32x4(x0, y0, 0xDD));
      store(dst + (c + 4) * ld_dst, _mm512_shuffle_f32x4(x1, y1, 0x88));
      store(dst + (c + 12) * ld_dst, _mm512_shuffle_f32x4(x1, y1, 0xDD));
    }
  }
};

// The decode kernel's operations besides Avx512's: horizontal sums and maxima, the transposing
// reduction, and the widening loads of each storage type.
struct Avx512Decode : Avx512 {
  static float hsum(V x) { return _mm512_reduce_add_ps(x); }
  static float hmax(V x) { return _mm512_reduce_max_ps(x); }
  // Lane j of the result = the sum of the lanes of a[j], j < 16: pairs, then quads within each
  // 128-bit lane, then the four 128-bit lanes.
  static V reduce_lanes(const V* a) {
    V c[8], d[4], e[2];
    for (int i = 0; i < 8; ++i)
      c[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; ++i)
      d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 2; ++i)
      e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(d[2 * i], d[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(d[2 * i], d[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], 0x88), _mm512_shuffle_f32x4(e[0], e[1], 0xDD));
  }
  static V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load_bf16(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static V load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
};

}  // namespace
}  // namespace qkv::kernels
