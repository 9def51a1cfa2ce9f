// The fused forward kernel's internal interface: the unit of work, the layout of a task's
// workspace, one tile function per SIMD family (<isa>/forward.cpp, the params are in params.h),
// and the driver (forward.cpp), which splits the work into tiles of query rows and runs them on
// OpenMP threads; each tile is computed by one thread, start to end.
#pragma once

#include <cstdint>

#include "kernels/params.h"
#include "kernels/workspace.h"

namespace qkv::kernels {

// Most query tiles one task runs together (ForwardParams::tile_group), and most rows per tile
// (ForwardParams::tile_rows): ForwardTile sizes its per-row arrays with it, and the planner
// (forward.cpp) asserts that it never asks for more.
constexpr int64_t kMaxTileGroup = 16;
constexpr int64_t kMaxTileRows = 64;

// One unit of work: query rows [i0, i0 + tile_group · tile_rows) of head h of batch row b.
struct ForwardTask {
  int64_t b = 0, h = 0, i0 = 0;
};

// What each slot of a thread's Workspace holds during a forward task (forward_tile.h, tile_group.h).
namespace forward_slot {
enum : int {
  q_t,       // the group's packed Qᵀ tiles
  scores,    // Sᵀ, then P, of the current key block
  out,       // the group's O accumulators
  v_pack,    // the block's V rows, packed (fp32, or bf16 pairs for vdpbf16ps)
  stats,     // m, l, alpha, the band bounds and the block max of every row of the group
  k_pack,    // the block's K rows, packed (fp32, or bf16 pairs)
  tiles,     // the group's ForwardTile objects
  p_pairs,   // P as bf16 pairs
  v_rows,    // V's pairs transposed, one row per value column (the AMX P·V's A, the group's)
  k_sizes,   // |k| of each key of the task's kv head (large_scores.h)
  wide,      // Qᵀ and rows of K widened to double for large_scores.h's second sum
  s_lo,      // what rounding the second sums to float left, laid out as scores
  block_pv,  // one key block's P·V, before it joins O
  count,
};
}  // namespace forward_slot

using ForwardFn = void (*)(const ForwardParams&, const ForwardTask&, Workspace&);

// Computes one tile; every family computes the same function (only rounding differs).
void forward_tile_avx512(const ForwardParams& p, const ForwardTask& task, Workspace& ws);
void forward_tile_avx2(const ForwardParams& p, const ForwardTask& task, Workspace& ws);
void forward_tile_scalar(const ForwardParams& p, const ForwardTask& task, Workspace& ws);
void forward_tile_neon(const ForwardParams& p, const ForwardTask& task, Workspace& ws);  // AArch64 only

// The vectorized 2^x of each family over n values (exposed for its accuracy test).
using Exp2Fn = void (*)(const float* x, float* y, int64_t n);
void exp2_avx512(const float* x, float* y, int64_t n);
void exp2_avx2(const float* x, float* y, int64_t n);
void exp2_scalar(const float* x, float* y, int64_t n);
void exp2_neon(const float* x, float* y, int64_t n);

// The micro-kernel's block product of each family with its column max (GemmArgs::col_max; exposed
// for its test): C [rows x cols] = A [rows x kdim] · B [kdim x cols], rows of A kdim floats apart,
// of B ldb, of C ldc; cols a multiple of 16 (every family's lanes divide it); K split into chunks
// where k_chunk says, if split_k (GemmArgs::split_k).
using GemmMaxFn = void (*)(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc,
                           float* col_max, int64_t rows, int64_t cols, bool split_k);
void gemm_max_avx512(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
                     int64_t rows, int64_t cols, bool split_k);
void gemm_max_avx2(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
                   int64_t rows, int64_t cols, bool split_k);
void gemm_max_scalar(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
                     int64_t rows, int64_t cols, bool split_k);
void gemm_max_neon(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
                   int64_t rows, int64_t cols, bool split_k);

// Runs the whole forward pass with the given SIMD family, on at most `num_threads` threads (0 or
// less: the default), as many as its work and tasks give a share (detail::threads_for_work).
void forward(const ForwardParams& p, Simd path, int num_threads);

}  // namespace qkv::kernels
