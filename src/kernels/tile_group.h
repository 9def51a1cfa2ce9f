// One task of the fused forward: the query tiles of a group run block by block, with what they
// share (the kv head's bounds for large_scores.h, the packed V block), written once for every SIMD
// family. Include after a family's <isa>/ops.h.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/forward_tile.h"

namespace qkv::kernels {
namespace {

// large_scores.h's norms of the task's kv head: a bound of |k| over every key (fp32, cheap; once
// per kv head and call, in p.k_bounds), and |k| of each key, only when a tile's gate passes.
template <class In>
float key_norm_bound(const ForwardParams& p, const ForwardTask& task) {
  const AttentionShape& s = p.shape;
  const int64_t hk = task.h / (s.H / s.Hkv);
  const In* k = ForwardParams::typed<In>(p.k) + p.k_stride.at(task.b, hk, 0);
  if (p.k_bounds == nullptr) return max_row_norm(k, p.k_stride.row, p.k_stride.col, s.M, s.D);
  std::atomic_ref<float> cached(p.k_bounds[task.b * s.Hkv + hk]);
  float bound = cached.load(std::memory_order_relaxed);
  if (std::isnan(bound)) {  // NaN never counts in the bound, so a computed one is never NaN
    bound = max_row_norm(k, p.k_stride.row, p.k_stride.col, s.M, s.D);
    cached.store(bound, std::memory_order_relaxed);
  }
  return bound;
}

// |k| of the keys [lo, hi) the task's tiles read, at sizes[j] (the other entries unset); the
// screens' vector loads read up to 64 entries past hi, which get the keys' norms too.
template <class In>
const float* key_sizes(const ForwardParams& p, const ForwardTask& task, int64_t lo, int64_t hi, Workspace& ws) {
  const AttentionShape& s = p.shape;
  float* sizes = ws.get<float>(forward_slot::k_sizes, static_cast<std::size_t>(s.M));
  const In* k = ForwardParams::typed<In>(p.k) + p.k_stride.at(task.b, task.h / (s.H / s.Hkv), 0);
  for (int64_t j = lo, end = std::min(s.M, hi + 64); j < end; ++j)
    sizes[j] = l2_norm(k + j * p.k_stride.row, p.k_stride.col, s.D);
  return sizes;
}

// Runs the task's tiles block-major: key block n of every tile, then block n + 1, so a block of K
// and V comes from L3 once per group and from L2 for the other tiles (a head's K and V outgrow
// L2 from M of about 2048). Each tile still sees its own blocks in its own order. One thing passes
// from tile to tile: whether large scores separate (ForwardTile::follow), which only decides in
// which order a first block's weighty scores are summed in double; the group, like the blocks,
// depends on the shape alone, so the bits do not depend on the threads.
template <class Ops, class In, bool Pairs>
void forward_group(const ForwardParams& p, const ForwardTask& task, Workspace& ws) {
  using Tile = ForwardTile<Ops, In, Pairs>;
  // The tiles live in the workspace, not in a stack array: a std::array of optional tiles was
  // zero-filled on every call, which doubled the time of a 3-token call (S1).
  static_assert(std::is_trivially_destructible_v<Tile>);
  const int64_t tiles = std::min(p.tile_group, (p.shape.N - task.i0 + p.tile_rows - 1) / p.tile_rows);
  Tile* group = ws.get<Tile>(forward_slot::tiles, static_cast<std::size_t>(tiles));
  std::array<int64_t, kMaxTileGroup> blocks;  // tile_group <= kMaxTileGroup
  PackedBlock packed;
  const float k_bound = Pairs ? 0.0f : key_norm_bound<In>(p, task);
  int64_t most = 0, keys_lo = p.shape.M, keys_hi = 0;
  bool refine = false;
  for (int64_t t = 0; t < tiles; ++t) {
    new (group + t) Tile(p, task, t, ws, &packed, k_bound);
    blocks[t] = group[t].start();
    most = std::max(most, blocks[t]);
    refine |= group[t].wants_key_sizes();
    if (blocks[t] > 0) {
      const auto [lo, hi] = group[t].keys();
      keys_lo = std::min(keys_lo, lo);
      keys_hi = std::max(keys_hi, hi);
    }
  }
  if (refine) {
    const float* sizes = key_sizes<In>(p, task, keys_lo, keys_hi, ws);
    double* wide = ws.get<double>(forward_slot::wide, static_cast<std::size_t>(refine_room(p.shape.D)));
    float* s_lo =
        ws.get<float>(forward_slot::s_lo, static_cast<std::size_t>(Ops::kKeyBlock * column_read_stride(p.tile_rows)));
    for (int64_t t = 0; t < tiles; ++t) group[t].use_key_sizes(sizes, wide, s_lo);
  }
  if constexpr (Pairs) {
    if (p.bf16_amx) Ops::TileDot::begin();  // this thread's tile configuration
  }
  for (int64_t n = 0; n < most; ++n)
    for (int64_t t = 0; t < tiles; ++t) {
      if (n >= blocks[t]) continue;
      if (n == 0 && t > 0 && refine) group[t].follow(group[t - 1]);
      group[t].step(n);
    }
  if constexpr (Pairs) {
    if (p.bf16_amx) Ops::TileDot::end();
  }
  for (int64_t t = 0; t < tiles; ++t) group[t].finish();
}

// Pairs is only instantiated for families that define Ops::PairDot (AVX512_BF16).
template <class Ops, bool Pairs = false>
void forward_tile(const ForwardParams& p, const ForwardTask& task, Workspace& ws) {
  if (!p.is_bf16())
    forward_group<Ops, float, false>(p, task, ws);
  else
    forward_group<Ops, bf16, Pairs>(p, task, ws);
}

// Applies Ops::exp2 to n values (for the accuracy test).
template <class Ops>
void exp2_array(const float* x, float* y, int64_t n) {
  float in[Ops::kLanes], out[Ops::kLanes];
  for (int64_t i = 0; i < n; i += Ops::kLanes) {
    const int64_t c = std::min<int64_t>(Ops::kLanes, n - i);
    for (int64_t j = 0; j < Ops::kLanes; ++j) in[j] = j < c ? x[i + j] : 0.0f;
    Ops::store(out, Ops::exp2(Ops::load(in)));
    for (int64_t j = 0; j < c; ++j) y[i + j] = out[j];
  }
}

// gemm_blocked with a column max (for its test; GemmMaxFn in forward.h).
template <class Ops>
void gemm_max(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
              int64_t rows, int64_t cols, bool split_k) {
  GemmArgs<float, float> g;
  g.kdim = kdim, g.a = a, g.a_row = kdim, g.a_k = 1, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc, g.col_max = col_max;
  g.split_k = split_k;
  gemm_blocked<Ops>(g, rows, cols / Ops::kLanes);
}

}  // namespace
}  // namespace qkv::kernels
