// The fused forward kernel's internal interface: the unit of work, the per-thread workspace, and
// one tile function per SIMD family (the params are in params.h). The driver (fused_forward.cpp)
// splits the work into tiles of query rows and runs them on OpenMP threads; each tile is
// computed by one thread, start to end.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/params.h"

namespace qkv::kernels {

// Most query tiles one task runs together (ForwardParams::tile_group), and most rows per tile
// (ForwardParams::tile_rows): ForwardTile sizes its per-row arrays with it, and the planner
// (fused_forward.cpp) asserts that it never asks for more.
constexpr int64_t kMaxTileGroup = 16;
constexpr int64_t kMaxTileRows = 64;

// One unit of work: query rows [i0, i0 + tile_group · tile_rows) of head h of batch row b.
struct TileTask {
  int64_t b = 0, h = 0, i0 = 0;
};

// Per-thread scratch buffers that only grow; a thread keeps them across calls, so a steady
// stream of calls allocates nothing.
class Workspace {
 public:
  static constexpr int kSlots = 12;
  // Returns room for at least `count` T (float or uint32_t), 64-byte aligned, in slot `slot`
  // (< kSlots); the previous contents of the slot are not kept.
  template <class T>
  T* get(int slot, std::size_t count) {
    return static_cast<T*>(bytes(slot, count * sizeof(T)));
  }

 private:
  void* bytes(int slot, std::size_t count);
  struct Free {
    void operator()(void* p) const;
  };
  std::array<std::unique_ptr<void, Free>, kSlots> buffers_;
  std::array<std::size_t, kSlots> sizes_{};
};

// What each slot of a thread's Workspace holds during a forward task (tile_forward.h, tile_group.h).
namespace forward_slot {
enum : int {
  q_t,      // the group's packed Qᵀ tiles
  scores,   // Sᵀ, then P, of the current key block
  out,      // the group's O accumulators
  v_pack,   // the block's V rows, packed (fp32, or bf16 pairs for vdpbf16ps)
  stats,    // m, l, alpha and the band bounds of every row of the group
  k_pack,   // the block's K rows, packed (fp32, or bf16 pairs)
  tiles,    // the group's ForwardTile objects
  p_pairs,  // P as bf16 pairs
  p_rows,   // P's pairs transposed, one row per query (the AMX tile product's A)
  k_sizes,  // |k| of each key of the task's kv head (large_scores.h)
  wide,     // Qᵀ widened to double for large_scores.h's second sum
  s_lo,     // what rounding the second sums to float left, laid out as scores
};
}  // namespace forward_slot

using TileFn = void (*)(const ForwardParams&, const TileTask&, Workspace&);

// Computes one tile; every family computes the same function (only rounding differs).
void forward_tile_avx512(const ForwardParams& p, const TileTask& task, Workspace& ws);
void forward_tile_avx2(const ForwardParams& p, const TileTask& task, Workspace& ws);
void forward_tile_scalar(const ForwardParams& p, const TileTask& task, Workspace& ws);
void forward_tile_neon(const ForwardParams& p, const TileTask& task, Workspace& ws);  // AArch64 only

// The vectorized 2^x of each family over n values (exposed for its accuracy test).
using Exp2Fn = void (*)(const float* x, float* y, int64_t n);
void exp2_avx512(const float* x, float* y, int64_t n);
void exp2_avx2(const float* x, float* y, int64_t n);
void exp2_scalar(const float* x, float* y, int64_t n);
void exp2_neon(const float* x, float* y, int64_t n);

// Runs the whole forward pass on `num_threads` threads with the given SIMD family.
void fused_forward(const ForwardParams& p, Simd path, int num_threads);

}  // namespace qkv::kernels
