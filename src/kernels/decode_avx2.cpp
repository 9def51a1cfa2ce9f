// The decode kernel compiled for AVX2 + FMA. fp16 pages widen with vcvtph2ps: F16C is assumed
// with AVX2 (every AVX2 CPU, Intel from Haswell and AMD from Excavator, has it).
#include "kernels/kernel_deps.h"
#include "kernels/decode_kernel.h"
#include "core/kv_codec.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")

#include "kernels/simd_avx2.h"

namespace qkv::kernels {
namespace {

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

#include "kernels/decode_chunk.h"

namespace qkv::kernels {

void decode_chunk_avx2(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_chunk<Avx2Decode>(p, task, ws);
}

void decode_widen_avx2(KVDtype dtype, const void* src, int64_t n, float* dst) {
  widen_row<Avx2Decode>(dtype, static_cast<const char*>(src), n, dst, n);
}

}  // namespace qkv::kernels

#pragma GCC pop_options
