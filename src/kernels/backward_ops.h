// The block operations of the fused backward (backward_tile.h) that need no task state: row copies,
// tile transposes, the micro-kernel's products and double dots, for one SIMD family (Ops). Include, as
// backward_tile.h, after a family's <isa>/ops.h.
#pragma once

#include <algorithm>
#include <bit>

#include "kernels/backward.h"
#include "kernels/microkernel.h"
#include "kernels/transpose_blocks.h"

namespace qkv::kernels {
namespace {

template <class Ops>
struct BackwardOps {
  using V = typename Ops::V;
  static constexpr int L = Ops::kLanes;
  static constexpr int64_t T = kBackwardTile;

  // dst[0, n) += src[0, n); n is a multiple of L.
  static void add_to(float* dst, const float* src, int64_t n) {
    for (int64_t i = 0; i < n; i += L) Ops::store(dst + i, Ops::add(Ops::load(dst + i), Ops::load(src + i)));
  }

  // dst[0, n) = src[0, width) read with element stride `stride`, then zeros up to n.
  static void copy_row(float* dst, const float* src, int64_t stride, int64_t width, int64_t n) {
    if (stride == 1)
      std::copy(src, src + width, dst);
    else
      for (int64_t d = 0; d < width; ++d) dst[d] = src[d * stride];
    std::fill(dst + width, dst + n, 0.0f);
  }

  // dst [width x T] = the key tile transposed: dst[d·T + c] = element d of row c (row c at
  // src + c·row_stride, element d at d·col_stride) for c < cols, 0 for the columns past them.
  // Whole blocks go through the family's register transpose where it has one (transpose_blocks).
  static void transpose_tile(float* dst, const float* src, int64_t row_stride, int64_t col_stride, int64_t width,
                             int64_t cols) {
    const int64_t d0 = col_stride == 1 ? transpose_blocks<Ops>(src, row_stride, cols, T, width, dst, T) : 0;
    for (int64_t d = d0; d < width; ++d) {
      for (int64_t c = 0; c < cols; ++c) dst[d * T + c] = src[c * row_stride + d * col_stride];
      std::fill(dst + d * T + cols, dst + (d + 1) * T, 0.0f);
    }
  }

  // c [m, n] = alpha ⊙ c + a · b (alpha null: c = a · b), a element (r, k) at a[r·a_row + k·a_k].
  static void product(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k, const float* b, int64_t ldb,
                      const float* alpha, int64_t kdim, int64_t m, int64_t n) {
    GemmArgs<float, float> g;
    g.kdim = kdim;
    g.a = a;
    g.a_row = a_row;
    g.a_k = a_k;
    g.b = b;
    g.ldb = ldb;
    g.c = c;
    g.ldc = ldc;
    g.alpha = alpha;
    gemm_blocked<Ops>(g, m, n / L);
  }

  // Key tile t's part of a group buffer of T · width floats per tile (kᵀ, vᵀ and k rows alike).
  static float* slot(float* base, int64_t t, int64_t width) { return base + t * width * T; }

  // A float's exponent field: all ones is an inf or NaN (backward_tile.h's worst_).
  static uint32_t exponent_bits(float x) { return std::bit_cast<uint32_t>(x) & 0x7F800000u; }

  static bool exceeds_half(V x) {
    alignas(64) float lanes[L];
    Ops::store(lanes, x);
    return std::any_of(lanes, lanes + L, [](float p) { return p > 0.5f; });
  }

  // Σ a[e]·b[e·b_stride] for e < n in double: exact products, one rounding per term.
  static double wide_dot(const float* a, const float* b, int64_t b_stride, int64_t n) {
    double d = 0.0;
    for (int64_t e = 0; e < n; ++e) d += static_cast<double>(a[e]) * b[e * b_stride];
    return d;
  }
};

}  // namespace
}  // namespace qkv::kernels
