// The fused backward's driver, FlashAttention-2 style with no N×M buffer: the work is split into
// tasks of (b, kv head, chunk of query rows), each computed start to end by one thread with the
// chosen SIMD family's task (backward_tile.h). Chunks are planned from the shape alone and their
// partial dk, dv sums are added in chunk order, so every bit of the result is the same for any
// thread count.
#include "kernels/backward.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/flush_subnormals.h"
#include "core/first_error.h"
#include "core/scratch.h"
#include "core/thread_share.h"
#include "kernels/workspace.h"
#include "qkv/interrupt.h"

namespace qkv::kernels {
namespace {

constexpr int64_t kTile = kBackwardTile;

// Query rows per chunk (whole tiles), from the shape alone. A (b, kv head) is split into up to 4
// chunks while there would be fewer than 4 tasks, so 2 or 3 threads still share shapes with
// B·Hkv = 1; each extra chunk costs a partial copy of dk and dv over the keys its rows see.
int64_t plan_chunk_rows(const AttentionShape& s) {
  const int64_t tiles = (s.N + kTile - 1) / kTile;
  int64_t chunks = 1;
  while (s.B * s.Hkv * chunks < 4 && chunks * 2 <= std::min<int64_t>(tiles, 4)) chunks *= 2;
  return std::max<int64_t>(1, (tiles + chunks - 1) / chunks) * kTile;
}

// Key tiles per group: a task visits each query tile against a group's key tiles in turn
// (backward_tile.h), so the chunk's packed q, dout and dq, which outgrow L2 from N of about 2048
// (3 MiB at S4), come from L3 once per group instead of once per key tile: 4 tiles ran S4 and S6
// about 3% faster than 1, 8 no faster than 4 (measured). A key tile's buffers (kᵀ, k, vᵀ and its
// dk, dv rows) must stay in L2 next to a query tile's: at most 640 KB for the group.
int64_t plan_key_group(const AttentionShape& s) {
  constexpr int64_t kGroupBytes = 640 * 1024, kMaxGroup = 4;
  const int64_t tile_bytes = kTile * (3 * s.D + 2 * s.Dv) * static_cast<int64_t>(sizeof(float));
  const int64_t key_tiles = std::max<int64_t>(1, (s.M + kTile - 1) / kTile);
  return std::clamp<int64_t>(kGroupBytes / std::max<int64_t>(tile_bytes, 1), 1, std::min(kMaxGroup, key_tiles));
}

void fill(const TensorView<float>& t, float value) {
  for_each_element(t, [value](float& x, const auto&) { x = value; });
}

// chunk_keys (params.h) of every chunk and batch row: the union of the chunk's rows' bands, widened
// to whole key tiles.
std::vector<detail::KeyBand> plan_chunk_keys(const BackwardParams& p, const std::vector<detail::KeyBand>& bands) {
  const AttentionShape& s = p.shape;
  std::vector<detail::KeyBand> keys(static_cast<std::size_t>(p.chunks * s.B));
  for (int64_t c = 0; c < p.chunks; ++c)
    for (int64_t b = 0; b < s.B; ++b) {
      detail::KeyBand seen{s.M, 0};
      for (int64_t i = c * p.chunk_rows; i < std::min(s.N, (c + 1) * p.chunk_rows); ++i) {
        const detail::KeyBand& band = bands[b * s.N + i];
        if (!band.empty()) seen = {std::min(seen.lo, band.lo), std::max(seen.hi, band.hi)};
      }
      keys[c * s.B + b] =
          seen.empty() ? detail::KeyBand{}
                       : detail::KeyBand{seen.lo / kTile * kTile, std::min(s.M, (seen.hi + kTile - 1) / kTile * kTile)};
    }
  return keys;
}

// dk, dv += the later chunks' partial sums of one key, in chunk order; returns whether every sum
// stayed finite (finite partials can sum past the range). A chunk whose rows cannot see the key
// wrote no partial: its sums are +0, so its partial would be scale·0 and 0, added here as such (a
// −0 becomes +0, as the partial's addition made it).
bool add_partials(const BackwardParams& p, TensorView<float> dk, TensorView<float> dv, int64_t key) {
  const AttentionShape& s = p.shape;
  const int64_t heads = s.B * s.Hkv;
  const int64_t b = key / (s.Hkv * s.M), hk = key / s.M % s.Hkv, j = key % s.M;
  const float unseen_dk = p.scale * 0.0f;
  bool finite = true;
  for (int64_t c = 1; c < p.chunks; ++c) {
    const detail::KeyBand& keys = p.chunk_keys[c * s.B + b];
    if (j < keys.lo || j >= keys.hi) {
      for (int64_t d = 0; d < s.D; ++d) dk(b, hk, j, d) += unseen_dk;
      for (int64_t e = 0; e < s.Dv; ++e) dv(b, hk, j, e) += 0.0f;
      continue;
    }
    const float* pk = p.dk_part + ((c - 1) * heads * s.M + key) * s.D;
    const float* pv = p.dv_part + ((c - 1) * heads * s.M + key) * s.Dv;
    for (int64_t d = 0; d < s.D; ++d) finite &= std::isfinite(dk(b, hk, j, d) += pk[d]);
    for (int64_t e = 0; e < s.Dv; ++e) finite &= std::isfinite(dv(b, hk, j, e) += pv[e]);
  }
  return finite;
}

// Each thread's scratch, as the last call left it: a task writes every element it reads (all of
// qkv_tests passes on every path with the scratch filled with NaN before each call). It stays
// with the thread across calls: a buffer allocated and freed per call was mapped and unmapped by
// malloc at these sizes, and with two threads the page faults and TLB shootdowns took ~0.7 ms a
// call, ten times a short call's work (B1 H12 N32 D64 at 2 threads: 0.73-0.88 ms in 12 processes
// of 15, 0.07 ms in the others). Up to kKeptScratchBytes (workspace.h).

Workspace& thread_workspace() {
  static thread_local Workspace ws;
  return ws;
}
float* thread_scratch(int64_t floats) { return thread_workspace().get<float>(0, static_cast<std::size_t>(floats)); }
void trim_thread_scratch() { thread_workspace().trim(0, kKeptScratchBytes); }

// Runs every task, then adds the partial sums (tasks, keys: how many of each); throws what a
// thread's scratch allocation threw (qkv::OutOfMemory).
void launch(const BackwardParams& p, TensorView<float> dk, TensorView<float> dv, BackwardFn fn, int threads,
            int64_t scratch_floats, std::atomic<bool>& nonfinite) {
  const AttentionShape& s = p.shape;
  const int64_t heads = s.B * s.Hkv, tasks = heads * p.chunks;
  // Later chunks are heavier under a causal mask, so they go first; the order cannot change the
  // result because each task is computed by one thread from start to end.
  auto run_task = [&](int64_t idx, float* mine) {
    const int64_t chunk = p.chunks - 1 - idx / heads, bh = idx % heads;
    const FlushSubnormals flush;
    fn(p, BackwardTask{bh / s.Hkv, bh % s.Hkv, chunk}, mine);
  };
  auto add = [&](int64_t key) {
    if (!add_partials(p, dk, dv, key)) nonfinite.store(true, std::memory_order_relaxed);
  };
  const int64_t keys = p.chunks > 1 ? heads * s.M : 0;
  // A stop request skips the remaining tasks (and key groups); the caller discards the partial gradients.
  InterruptScope* const interrupt = p.interrupt;
  if (threads == 1) {
    float* mine = thread_scratch(scratch_floats);
    for (int64_t idx = 0; idx < tasks && !stop_requested(interrupt); ++idx) run_task(idx, mine);
    trim_thread_scratch();
    throw_if_stopped(interrupt);
    for (int64_t key = 0; key < keys; ++key) add(key);
    return;
  }
  // A thread whose scratch cannot be allocated runs no task; the call throws that after the region.
  detail::FirstError error;
  // Every barrier costs a lot on a loaded machine (a waiting thread spins on a core the others
  // need), so there is one per call only when the chunks' partial sums need adding.
#pragma omp parallel num_threads(threads)
  {
    float* mine = nullptr;
    error.run([&] { mine = thread_scratch(scratch_floats); });
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t idx = 0; idx < tasks; ++idx)
      if (mine != nullptr && !stop_requested(interrupt)) run_task(idx, mine);
    trim_thread_scratch();
    if (keys > 0) {  // the same for every thread, so all of them meet the barrier
#pragma omp barrier
#pragma omp for schedule(static) nowait
      for (int64_t key = 0; key < keys; ++key) add(key);
    }
  }
  error.rethrow();
  throw_if_stopped(interrupt);
}

}  // namespace

bool backward(BackwardParams p, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias, Simd path,
              int num_threads) {
  const AttentionShape& s = p.shape;
  const BackwardFn fn = kernel_family(path).backward;
  std::vector<detail::KeyBand> bands(static_cast<std::size_t>(s.B * s.N)), extents(static_cast<std::size_t>(s.B));
  for (int64_t b = 0; b < s.B; ++b) {
    detail::KeyBand& seen = extents[b];
    seen = {s.M, 0};
    for (int64_t i = 0; i < s.N; ++i) {
      const detail::KeyBand band = bands[b * s.N + i] = p.mask->band(b, i);
      if (!band.empty()) seen = {std::min(seen.lo, band.lo), std::max(seen.hi, band.hi)};
    }
  }
  if (!dbias.empty()) fill(dbias, 0.0f);  // tile pairs that no query can see are never visited
  if (s.N == 0) {                         // no query: nothing depends on k or v
    fill(dk, 0.0f);
    fill(dv, 0.0f);
    return true;
  }
  p.bands = bands.data(), p.key_extents = extents.data();
  p.chunk_rows = plan_chunk_rows(s);
  p.chunks = (s.N + p.chunk_rows - 1) / p.chunk_rows;
  p.key_group = plan_key_group(s);
  const int64_t heads = s.B * s.Hkv, tasks = heads * p.chunks;
  const std::vector<detail::KeyBand> chunk_keys = plan_chunk_keys(p, bands);
  p.chunk_keys = chunk_keys.data();
  for (const detail::KeyBand& keys : chunk_keys) p.chunk_key_rows = std::max(p.chunk_key_rows, keys.hi - keys.lo);
  // Not cleared: a task writes every row of its chunk_keys before the driver reads it, and no other
  // row is read (clearing them cost most of a narrow window's call).
  const int64_t part_rows = (p.chunks - 1) * heads * s.M;
  const detail::Scratch dk_part(part_rows * s.D, "attention_backward partial dk");
  const detail::Scratch dv_part(part_rows * s.Dv, "attention_backward partial dv");
  p.dk_part = dk_part.data(), p.dv_part = dv_part.data();
  // S = Q·Kᵀ, dP = dO·Vᵀ, dV += Pᵀ·dO, dQ += dS·K and dK += dSᵀ·Q, as if no key were masked.
  const double work = static_cast<double>(s.B * s.H) * static_cast<double>(s.N) * static_cast<double>(s.M) *
                      static_cast<double>(3 * s.D + 2 * s.Dv);
  const int threads = detail::threads_for_work(num_threads, tasks, work);
  std::atomic<bool> nonfinite{false};  // set by the tasks and the partial sums
  p.nonfinite = &nonfinite;
  p.interrupt = InterruptScope::current();
  launch(p, dk, dv, fn, threads, BackwardLayout(p).total, nonfinite);
  return !nonfinite.load();
}

}  // namespace qkv::kernels
