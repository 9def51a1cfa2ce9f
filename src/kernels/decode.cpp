// The decode driver: the chunk plan (from the sequence lengths alone), the OpenMP launch over
// (sequence, chunk, KV head) tasks, and the fixed-order merge of each row's chunks.
#include "kernels/decode.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/flush_subnormals.h"
#include "core/first_error.h"
#include "core/thread_share.h"
#include "qkv/interrupt.h"

namespace qkv::kernels {
namespace {

// Chunks of a sequence: at least kMinChunk keys each (a task then costs far more than its
// merge), at most kMaxChunks of them, so the partial results take O(B·H·N·Dv) memory for any
// length. 32 chunks of a 32k sequence keep 32 threads busy at B·Hkv = 1. Against 256 and 64:
// D1 cold, 2 threads, CPU time per step -2..-3% (f16) and -3..-7% (i8), from the merge and each
// task's start (bench/decode_bench.cpp, 2 alternations).
constexpr int64_t kMinChunk = 512;
constexpr int64_t kMaxChunks = 32;
// Pages of at least this many tokens take the head-major task order (DecodePlan).
constexpr int64_t kHeadMajorPage = 256;

struct ChunkPlan {
  int64_t chunk = 0;  // keys per chunk (a multiple of kDecodeBlock)
  int64_t count = 0;
};

ChunkPlan plan_chunks(int64_t len) {
  if (len == 0) return {};
  const int64_t count = std::clamp<int64_t>((len + kMinChunk - 1) / kMinChunk, 1, kMaxChunks);
  const int64_t block = kDecodeBlock;
  const int64_t chunk = ((len + count - 1) / count + block - 1) / block * block;
  return {chunk, (len + chunk - 1) / chunk};
}

Workspace& chunk_workspace() {
  static thread_local Workspace ws;
  return ws;
}
// The calling thread's partial results; a separate object, since it also runs chunks.
Workspace& partial_workspace() {
  static thread_local Workspace ws;
  return ws;
}

// Every task of a call and where its partial result (o, m, l) lives. The plan, and so every bit
// of the result, depends on the lengths alone; the order of the tasks only on how the pool lays
// out a KV head's keys (parallel_for hands out runs of up to 8 tasks). Pages of 256 tokens or more:
// (sequence, KV head, chunk), so a thread streams a run of one head's keys (D1 M = 32768, 2
// threads, cold: f16 -3..-9%, i8 -5..-7%; D2 contiguous -11%). Smaller pages hold every head's
// rows of a few tokens side by side: (sequence, chunk, KV head) keeps a page's rows together (D2
// cold with 64-token pages 4% and with 16-token pages 5% faster than the other order; 256-token
// pages the same either way).
struct DecodePlan {
  DecodePlan(const DecodeParams& p, const int64_t* seq_lens) : p(p), seq_lens(seq_lens) {
    head_major = p.page_tokens >= kHeadMajorPage;
    plans.resize(static_cast<std::size_t>(p.B));
    first_task.assign(static_cast<std::size_t>(p.B) + 1, 0);
    for (int64_t b = 0; b < p.B; ++b) {
      plans[b] = plan_chunks(seq_lens[b]);
      first_task[b + 1] = first_task[b] + plans[b].count * p.Hkv;
    }
    tasks = first_task[p.B], rows = p.G * p.N;
    task_floats = rows * (p.dvp + 2);
    partial = partial_workspace().get<float>(0, static_cast<std::size_t>(std::max<int64_t>(tasks * task_floats, 1)));
  }

  // Task (b, g, c): sequence b's chunk c for KV head g, at index first_task[b] + g·count + c
  // (head-major) or + c·Hkv + g; launch inverts that index.
  DecodeTask task(int64_t b, int64_t g, int64_t c) const {
    float* base = partial + (first_task[b] + (head_major ? g * plans[b].count + c : c * p.Hkv + g)) * task_floats;
    const int64_t j0 = c * plans[b].chunk;
    const int64_t j1 = std::min(j0 + plans[b].chunk, seq_lens[b]);
    return DecodeTask{b,
                      g,
                      j0,
                      j1,
                      head_major ? std::min(j1 + p.prefetch_keys, seq_lens[b]) : j1,
                      base,
                      base + rows * p.dvp,
                      base + rows * (p.dvp + 1)};
  }

  const DecodeParams& p;
  const int64_t* seq_lens;
  bool head_major = false;
  std::vector<ChunkPlan> plans;
  std::vector<int64_t> first_task;
  int64_t tasks = 0, rows = 0, task_floats = 0;
  float* partial = nullptr;
};

// Runs fn(i) for i in [0, n) on `threads` threads, which take runs of up to 8 consecutive items
// (a KV head's chunks in order), fewer when 8 would leave a thread without any. An exception (a
// failed scratch allocation) must not leave the OpenMP region, so it is reported after. A stop
// request (qkv/interrupt.h) skips the remaining items and throws Interrupted; the caller discards
// the partial output, and an item that runs computes what it always does.
template <class Fn>
void parallel_for(int64_t n, int threads, const Fn& fn) {
  InterruptScope* const interrupt = InterruptScope::current();
  if (threads <= 1) {
    for (int64_t i = 0; i < n && !stop_requested(interrupt); ++i) fn(i);
    throw_if_stopped(interrupt);
    return;
  }
  const int64_t run = std::clamp<int64_t>(n / threads, 1, 8);
  detail::FirstError error;
#pragma omp parallel for schedule(dynamic, run) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) {
    if (stop_requested(interrupt)) continue;
    error.run([&] { fn(i); });
  }
  error.rethrow();
  throw_if_stopped(interrupt);
}

// One element of a chunk's result merged (float64, in the baseline instruction set) takes about
// as long as 32 multiply-adds of a task (0.4 ns against 17 ns for a KV head's key at 4 rows).
constexpr double kMergeElementWork = 32;

void launch(const DecodePlan& plan, DecodeFn fn, int num_threads) {
  const std::vector<int64_t>& first = plan.first_task;
  double keys = 0;
  for (int64_t b = 0; b < plan.p.B; ++b) keys += static_cast<double>(plan.seq_lens[b]);
  const double work = keys * static_cast<double>(plan.p.Hkv * plan.rows * (plan.p.D + plan.p.Dv));
  parallel_for(plan.tasks, detail::threads_for_work(num_threads, plan.tasks, work), [&](int64_t t) {
    const int64_t b = std::upper_bound(first.begin(), first.end(), t) - first.begin() - 1;
    const int64_t i = t - first[b], n = plan.head_major ? plan.plans[b].count : plan.p.Hkv;
    const FlushSubnormals flush;
    fn(plan.p, plan.head_major ? plan.task(b, i / n, i % n) : plan.task(b, i % n, i / n), chunk_workspace());
  });
}

// Whether the keep-mask and bias leave row (b, h, i) any key of its band (decode_band).
bool keeps_a_key(const DecodeParams& p, int64_t b, int64_t h, int64_t i) {
  const DecodeBand band = decode_band(p, b, i);
  for (int64_t j = 0; j < band.prefix_end; ++j)
    if (p.mask->keeps(b, h, i, j)) return true;
  for (int64_t j = std::max(band.lo, band.prefix_end); j < band.hi; ++j)
    if (p.mask->keeps(b, h, i, j)) return true;
  return false;
}

// Row (b, h, i) combines its chunks c = 0, 1, ... in order, in double. Returns false for a chunk
// whose l is NaN or m +inf, an output that is not finite, or a row that kept none of the keys its
// mask keeps (every such score -inf): that can only come from a non-finite q or from scores or
// P·V sums past fp32 (the cache holds finite values, sinks are checked). A row the keep-mask or a
// -inf bias empties, in one chunk or in all, is no fault: 0 with lse -inf.
bool merge_row(const DecodePlan& plan, const float* sinks, TensorView<float> out, TensorView<float> lse, int64_t b,
               int64_t h, int64_t i) {
  const DecodeParams& p = plan.p;
  const int64_t g = h / p.G, r = (h - g * p.G) * p.N + i, count = plan.plans[b].count;
  const double sink = sinks == nullptr ? -std::numeric_limits<double>::infinity() : sinks[h];
  bool finite = true;
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < count; ++c) {
    const DecodeTask t = plan.task(b, g, c);
    if (t.l[r] > 0.0f) mx = std::max<double>(mx, t.m[r]);
    if (std::isnan(t.l[r]) || std::isnan(t.m[r]) || t.m[r] == std::numeric_limits<float>::infinity()) finite = false;
  }
  float* o = out.data() + b * out.stride(0) + h * out.stride(1) + i * out.stride(2);
  float* l = lse.empty() ? nullptr : lse.data() + b * lse.stride(0) + h * lse.stride(1) + i * lse.stride(2);
  if (mx == -std::numeric_limits<double>::infinity()) {  // no key kept
    for (int64_t e = 0; e < p.Dv; ++e) o[e * out.stride(3)] = 0.0f;
    if (l != nullptr) *l = -std::numeric_limits<float>::infinity();
    return finite && !keeps_a_key(p, b, h, i);  // a key the mask keeps scored below -FLT_MAX
  }
  mx = std::max(mx, sink);
  double acc[512];  // Dv <= 512 per pass
  float row[512];   // for an out whose elements are not contiguous
  for (int64_t e0 = 0; e0 < p.Dv; e0 += 512) {
    const int64_t ne = std::min<int64_t>(512, p.Dv - e0);
    std::fill(acc, acc + ne, 0.0);
    double sum = std::exp(sink - mx);
    for (int64_t c = 0; c < count; ++c) {
      const DecodeTask t = plan.task(b, g, c);
      if (!(t.l[r] > 0.0f)) continue;
      const double w = std::exp(static_cast<double>(t.m[r]) - mx);
      sum += w * t.l[r];
      for (int64_t e = 0; e < ne; ++e) acc[e] += w * t.o[r * p.dvp + e0 + e];
    }
    // One division per row, then a contiguous row whose products and finiteness test run in
    // vectors: a divide, store and test per element took half of a short step's time. In double,
    // acc · (1 / sum) is within an ulp of acc / sum, far below the float it is rounded to.
    const double inv = 1.0 / sum;
    float* dst = out.stride(3) == 1 ? o + e0 : row;
    int overflowed = 0;
    for (int64_t e = 0; e < ne; ++e) {
      dst[e] = static_cast<float>(acc[e] * inv);
      overflowed |= !(std::fabs(dst[e]) <= std::numeric_limits<float>::max());
    }
    finite &= overflowed == 0;
    if (dst == row)
      for (int64_t e = 0; e < ne; ++e) o[(e0 + e) * out.stride(3)] = row[e];
    if (l != nullptr && e0 == 0) *l = static_cast<float>(mx + std::log(sum));
  }
  return finite;
}

// Merges every row; returns false when a row was not finite (merge_row), never merging such a row
// into zeros.
bool merge(const DecodePlan& plan, const float* sinks, TensorView<float> out, TensorView<float> lse, int num_threads) {
  const DecodeParams& p = plan.p;
  std::atomic<bool> nonfinite{false};
  const double chunks = static_cast<double>(plan.tasks / p.Hkv);  // of every sequence
  const double work = chunks * static_cast<double>(p.H * p.N * p.Dv) * kMergeElementWork;
  parallel_for(p.B * p.H, detail::threads_for_work(num_threads, p.B * p.H, work), [&](int64_t bh) {
    for (int64_t i = 0; i < p.N; ++i)
      if (!merge_row(plan, sinks, out, lse, bh / p.H, bh % p.H, i)) nonfinite.store(true, std::memory_order_relaxed);
  });
  return !nonfinite.load();
}

}  // namespace

bool decode(const DecodeParams& params, const int64_t* seq_lens, const float* sinks, TensorView<float> out,
            TensorView<float> lse, Simd path, int num_threads) {
  DecodeParams p = params;
  p.dvp = (p.Dv + 15) / 16 * 16;
  const int64_t row_bytes = (p.D + p.Dv) * kv_dtype_bytes(p.dtype);  // one key's K and V row
  p.prefetch_keys = decode_prefetch_keys(row_bytes);
  p.block_keys = decode_block_keys(row_bytes, path);
  const DecodePlan plan(p, seq_lens);
  launch(plan, kernel_family(path).decode, num_threads);
  const bool finite = merge(plan, sinks, out, lse, num_threads);
  partial_workspace().trim(0, kKeptScratchBytes);
  return finite;
}

}  // namespace qkv::kernels
