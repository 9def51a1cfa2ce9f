// Tile helpers of the fp32 attention backward: packing strided [B, H, T, D] tensors into small
// contiguous tiles, and the one block product every step of the backward is made of. Plain C++
// written so the compiler vectorizes the inner loops; tile_gemm has the shape of the SIMD
// micro-kernel's GemmArgs (src/kernels/microkernel.h) so it can be swapped for it. Internal.
#pragma once

#include <cstdint>

#include "qkv/tensor.h"

namespace qkv::detail {

// dst[r * ld + d] = t(b, h, r0 + r, d) for r < rows, d < width.
inline void pack_rows(float* dst, int64_t ld, const TensorView<const float>& t, int64_t b, int64_t h, int64_t r0,
                      int64_t rows, int64_t width) {
  const float* base = t.data() + b * t.stride(0) + h * t.stride(1) + r0 * t.stride(2);
  const int64_t sr = t.stride(2), sd = t.stride(3);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < width; ++d) dst[r * ld + d] = base[r * sr + d * sd];
}

// The transpose: dst[d * ld + c] = t(b, h, c0 + c, d) for c < cols, d < width.
inline void pack_cols(float* dst, int64_t ld, const TensorView<const float>& t, int64_t b, int64_t h, int64_t c0,
                      int64_t cols, int64_t width) {
  const float* base = t.data() + b * t.stride(0) + h * t.stride(1) + c0 * t.stride(2);
  const int64_t sc = t.stride(2), sd = t.stride(3);
  for (int64_t d = 0; d < width; ++d)
    for (int64_t c = 0; c < cols; ++c) dst[d * ld + c] = base[c * sc + d * sd];
}

// c: [m, n] (row stride ldc) = a · b, or += when `accumulate`. Element (r, k) of a is
// a[r * a_row + k * a_k], so a may be a transposed tile; b: [kdim, n] with row stride ldb.
// The sum over k runs in increasing order, so results do not depend on threads.
inline void tile_gemm(float* __restrict c, int64_t ldc, const float* __restrict a, int64_t a_row, int64_t a_k,
                      const float* __restrict b, int64_t ldb, int64_t m, int64_t n, int64_t kdim, bool accumulate) {
  for (int64_t r = 0; r < m; ++r) {
    float* __restrict crow = c + r * ldc;
    if (!accumulate)
      for (int64_t j = 0; j < n; ++j) crow[j] = 0.0f;
    for (int64_t k = 0; k < kdim; ++k) {
      const float ar = a[r * a_row + k * a_k];
      const float* __restrict brow = b + k * ldb;
      for (int64_t j = 0; j < n; ++j) crow[j] += ar * brow[j];
    }
  }
}

}  // namespace qkv::detail
