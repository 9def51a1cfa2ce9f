// The room large_scores.h's refine_scores sums in, apart from it so that the workspace layouts
// (backward.h, tile_group.h) size it without a family's ops.
#pragma once

#include <cstdint>

namespace qkv::kernels {

constexpr int64_t kWideCols = 64;  // columns of one refine_scores block: 8 Wide per row
constexpr int kRefineRows = 3;     // rows of a pass, sharing each load of the widened columns

// Doubles refine_scores needs at `wide` for sums over kdim: the block's columns widened (kdim rows
// of kWideCols), then the rows of one pass (kRefineRows of kdim).
constexpr int64_t refine_room(int64_t kdim) { return (kWideCols + kRefineRows) * kdim; }

}  // namespace qkv::kernels
