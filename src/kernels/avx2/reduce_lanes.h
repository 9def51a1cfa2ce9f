// The AVX2 decode kernel's transposing reduction, in its own header so that the probe that
// measures the kernel's arithmetic (bench/decode_floor_probe.cpp) runs this very code. Needs AVX2
// code generation (this folder's compile options, or -mavx2).
#pragma once

#include <immintrin.h>

namespace qkv::kernels {

// Lane j of the result = the sum of the lanes of a[j], j < 8: pairs, then quads within each
// 128-bit lane, then the two 128-bit lanes (as reduce_lanes_avx512).
inline __m256 reduce_lanes_avx2(const __m256* a) {
  __m256 c[4], d[2];
  for (int i = 0; i < 4; ++i)
    c[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 2; ++i)
    d[i] = _mm256_add_ps(_mm256_shuffle_ps(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(_mm256_permute2f128_ps(d[0], d[1], 0x20), _mm256_permute2f128_ps(d[0], d[1], 0x31));
}

}  // namespace qkv::kernels
