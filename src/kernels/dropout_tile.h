// Dropout in the fused kernels' tiles (qkv/dropout.h): the one walk over a tile's keep-mask that
// the forward and the backward share. Include, as the tiles, after a family's <isa>/ops.h.
#pragma once

namespace qkv::kernels {
namespace {

// Calls f(r, c, kept) for each cell of the tile of query rows [i0, i0 + rows) of head (b, h)
// against keys [j0, j0 + cols), row by row (each row's generator state is reused across its keys).
template <class F>
void for_each_kept(const Dropout& d, int64_t H, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                   int64_t cols, F&& f) {
  for (int64_t r = 0; r < rows; ++r) {
    const DropoutRow row(d, H, b, h, i0 + r);
    for (int64_t c = 0; c < cols; ++c) f(r, c, row.keep(j0 + c));
  }
}

}  // namespace
}  // namespace qkv::kernels
