// The AVX-512 decode kernel's transposing reduction, in its own header so that the probes that
// measure the kernel's arithmetic (bench/decode_floor_probe.cpp)
// run this very code. Needs AVX-512 code generation (this folder's compile options, or -mavx512f).
#pragma once

#include <immintrin.h>

namespace qkv::kernels {

// Lane j of the result = the sum of the lanes of a[j], j < 16: pairs, then quads within each
// 128-bit lane, then the four 128-bit lanes.
inline __m512 reduce_lanes_avx512(const __m512* a) {
  __m512 c[8], d[4], e[2];
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

}  // namespace qkv::kernels
