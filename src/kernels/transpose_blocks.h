// Packing a matrix transposed through a family's register transpose (Ops::transpose), shared by
// the forward's Qᵀ tiles and the backward's key tiles. Include after a family's <isa>/ops.h.
#pragma once

namespace qkv::kernels {
namespace {

// dst[d·ld_dst + r] = src[r·row_stride + d] for the whole blocks of Ops::kTranspose columns d of
// rows r < lanes (lanes a multiple of Ops::kLanes; rows at or past `rows` read as 0). Returns the
// columns done: 0 for a family without a register transpose; the caller packs the rest. A loop of
// strided scalar loads in its place was 7% of S2's backward and 8.7% of its forward (Zen 3).
template <class Ops>
int64_t transpose_blocks(const float* src, int64_t row_stride, int64_t rows, int64_t lanes, int64_t width, float* dst,
                         int64_t ld_dst) {
  constexpr int64_t B = Ops::kTranspose;
  int64_t d0 = 0;
  if constexpr (B > 0) {
    static_assert(Ops::kLanes % B == 0, "blocks of rows tile the lanes");
    for (; d0 + B <= width; d0 += B)
      for (int64_t r0 = 0; r0 < lanes; r0 += B) {
        const int64_t n = std::clamp<int64_t>(rows - r0, 0, B);
        Ops::transpose(n > 0 ? src + r0 * row_stride + d0 : src, row_stride, n, dst + d0 * ld_dst + r0, ld_dst);
      }
  }
  return d0;
}

}  // namespace
}  // namespace qkv::kernels
