// The fused forward driver: splits (b, h, query tile) work items over OpenMP threads.
#include "kernels/forward.h"

#include "kernels/dispatch.h"
#include "kernels/flush_subnormals.h"
#include "core/first_error.h"
#include "core/thread_share.h"
#include "qkv/interrupt.h"
#include "qkv/machine.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <omp.h>

namespace qkv::kernels {

namespace {

// Query rows per tile, from the shape alone (see ForwardParams::tile_rows). With tiles grouped
// (plan_tile_group), 64 rows beat 32 by 5-7% on S3-S6 and 128 rows (1 thread, per CPU second,
// measured). Short sequences get smaller tiles so two threads still have work at B·H = 1.
constexpr int64_t kLongTileRows = 64;
static_assert(kLongTileRows <= kMaxTileRows, "ForwardTile's per-row arrays hold kMaxTileRows rows");

int64_t plan_tile_rows(const AttentionShape& s) {
  int64_t rows = kLongTileRows;
  while (rows > 16 && s.B * s.H * ((s.N + rows - 1) / rows) < 4) rows /= 2;
  return rows;
}

// Tiles per task. The task's tiles run block-major (tile_group.h), so each key block of K and V
// is fetched from L3 once per task instead of once per tile: on S4 and S6, whose K and V outgrow
// L2, 16 tiles ran 10-25% faster than 1 and 3% faster than 8. The tiles' own
// Qᵀ and O buffers, (D + Dv) floats per row, must stay in L2 next to the blocks: at most 512 KB.
// Fewer tiles when that would leave under 8 tasks for the threads.
int64_t plan_tile_group(const AttentionShape& s, int64_t tile_rows) {
  constexpr int64_t kGroupBytes = 512 * 1024;
  const int64_t tile_bytes = tile_rows * (s.D + s.Dv) * static_cast<int64_t>(sizeof(float));
  int64_t group = std::clamp<int64_t>(kGroupBytes / tile_bytes, 1, kMaxTileGroup);
  const int64_t tiles = (s.N + tile_rows - 1) / tile_rows;
  while (group > 1 && s.B * s.H * ((tiles + group - 1) / group) < 8) group /= 2;
  return group;
}

// Each thread keeps its buffers across calls (OpenMP reuses its threads).
Workspace& thread_workspace() {
  static thread_local Workspace ws;
  return ws;
}

}  // namespace

void forward(const ForwardParams& params, Simd path, int num_threads) {
  ForwardParams p = params;
  const AttentionShape& s = p.shape;
  p.tile_rows = plan_tile_rows(s);
  p.bf16_dot = p.is_bf16() && path == Simd::avx512 && cpu_features().avx512_bf16;
  p.bf16_amx = p.bf16_dot && bf16_product_isa(s.D, s.Dv) == PeakIsa::amx_bf16;
  p.tile_group = plan_tile_group(s, p.tile_rows);
  p.key_block = fp32_key_block();
  const int64_t task_rows = p.tile_rows * p.tile_group;
  const int64_t tiles = (s.N + task_rows - 1) / task_rows;
  const int64_t heads = s.B * s.H;
  const int64_t items = heads * tiles;
  if (items == 0) return;
  const ForwardFn fn = kernel_family(path).forward;
  std::vector<float> k_bounds(static_cast<std::size_t>(s.B * s.Hkv), std::numeric_limits<float>::quiet_NaN());
  p.k_bounds = k_bounds.data();
  // Later tiles are heavier under a causal mask, so they go first; the order cannot change the
  // result because each tile is computed by one thread from start to end.
  auto task_of = [&](int64_t idx) {
    const int64_t tile = tiles - 1 - idx / heads, bh = idx % heads;
    return ForwardTask{bh / s.H, bh % s.H, tile * task_rows};
  };
  // Q·Kᵀ and P·V, as if no key were masked.
  const double work = static_cast<double>(heads) * static_cast<double>(s.N) * static_cast<double>(s.M) *
                      static_cast<double>(s.D + s.Dv);
  const int threads = detail::threads_for_work(num_threads, items, work);
  // A stop request skips the remaining tasks; the caller discards the partial output.
  InterruptScope* const interrupt = InterruptScope::current();
  if (threads == 1) {
    const FlushSubnormals flush;
    Workspace& ws = thread_workspace();
    for (int64_t idx = 0; idx < items && !stop_requested(interrupt); ++idx) fn(p, task_of(idx), ws);
    throw_if_stopped(interrupt);
    return;
  }
  // The only exception possible here is a failed allocation of a thread's tile buffers.
  detail::FirstError error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t idx = 0; idx < items; ++idx) {
    if (stop_requested(interrupt)) continue;
    error.run([&] {
      const FlushSubnormals flush;
      fn(p, task_of(idx), thread_workspace());
    });
  }
  error.rethrow();
  throw_if_stopped(interrupt);
}

}  // namespace qkv::kernels
