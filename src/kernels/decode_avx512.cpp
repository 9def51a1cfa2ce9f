// The decode kernel compiled for AVX-512 (dispatch.cpp: only on CPUs with F, BW, DQ, VL).
// fp16 pages widen with vcvtph2ps (F16C, which every AVX-512 CPU has).
#include "kernels/kernel_deps.h"
#include "kernels/decode_kernel.h"
#include "core/kv_codec.h"

#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2")

#include "kernels/simd_avx512.h"
#include "kernels/reduce_lanes_avx512.h"

namespace qkv::kernels {
namespace {

struct Avx512Decode : Avx512 {
  static float hsum(V x) { return _mm512_reduce_add_ps(x); }
  static float hmax(V x) { return _mm512_reduce_max_ps(x); }
  static V reduce_lanes(const V* a) { return reduce_lanes_avx512(a); }
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

#include "kernels/decode_chunk.h"

namespace qkv::kernels {

void decode_chunk_avx512(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_chunk<Avx512Decode>(p, task, ws);
}

void decode_widen_avx512(KVDtype dtype, const void* src, int64_t n, float* dst) {
  widen_row<Avx512Decode>(dtype, static_cast<const char*>(src), n, dst, n);
}

}  // namespace qkv::kernels

#pragma GCC diagnostic pop
#pragma GCC pop_options
