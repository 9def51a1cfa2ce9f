// decode_attention: input checks, the chunk plan (from the sequence lengths alone), the OpenMP
// driver over (sequence, chunk, KV head) tasks, and the fixed-order merge of the chunks.
#include "qkv/decode.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <omp.h>

#include "kernels/decode_kernel.h"
#include "kernels/dispatch.h"
#include "kernels/flush_subnormals.h"

namespace qkv {
namespace {

using kernels::DecodeParams;
using kernels::DecodeTask;
using kernels::Workspace;

// Chunks of a sequence: at least kMinChunk keys each (a task then costs far more than its
// merge), at most kMaxChunks of them, so the partial results take O(B·H·N·Dv) memory for any
// length. 32 chunks of a 32k sequence keep 32 threads busy at B·Hkv = 1. Against 256 and 64:
// D1 cold, 2 threads, CPU time per step -2..-3% (f16) and -3..-7% (i8), from the merge and each
// task's start (bench/decode_bench.cpp, 2 alternations).
constexpr int64_t kMinChunk = 512;
constexpr int64_t kMaxChunks = 32;

struct ChunkPlan {
  int64_t chunk = 0;  // keys per chunk (a multiple of kDecodeBlock)
  int64_t count = 0;
};

ChunkPlan plan_chunks(int64_t len) {
  if (len == 0) return {};
  const int64_t count = std::clamp<int64_t>((len + kMinChunk - 1) / kMinChunk, 1, kMaxChunks);
  const int64_t block = kernels::kDecodeBlock;
  const int64_t chunk = ((len + count - 1) / count + block - 1) / block * block;
  return {chunk, (len + chunk - 1) / chunk};
}

void check_paged(const PagedKV& kv) {
  if (kv.Hkv <= 0 || kv.D <= 0 || kv.Dv <= 0 || kv.page_tokens <= 0 || kv.num_pages <= 0)
    throw Error(
        fmt::format("decode_attention: the cache's Hkv, D, Dv, page_tokens and num_pages must be positive, "
                    "got {}, {}, {}, {}, {}",
                    kv.Hkv, kv.D, kv.Dv, kv.page_tokens, kv.num_pages));
  if (kv.k == nullptr || kv.v == nullptr ||
      (kv.dtype == KVDtype::i8 && (kv.k_scale == nullptr || kv.v_scale == nullptr)))
    throw Error("decode_attention: the cache's pools (and i8 scales) must be set");
  const int64_t B = kv.batch();
  if (kv.max_blocks < 0 || static_cast<int64_t>(kv.block_table.size()) != B * kv.max_blocks)
    throw Error(fmt::format("decode_attention: block_table has {} entries, expected B · max_blocks = {} · {}",
                            kv.block_table.size(), B, kv.max_blocks));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = kv.seq_lens[b];
    if (len < 0 || len > kv.max_blocks * kv.page_tokens)
      throw Error(fmt::format("decode_attention: seq_lens[{}] = {} is outside [0, max_blocks · page_tokens = {}]", b,
                              len, kv.max_blocks * kv.page_tokens));
    for (int64_t e = 0; e < (len + kv.page_tokens - 1) / kv.page_tokens; ++e) {
      const int32_t page = kv.block_table[b * kv.max_blocks + e];
      if (page < 0 || page >= kv.num_pages)
        throw Error(fmt::format("decode_attention: block_table[{}, {}] = {} points outside the pool of {} pages", b, e,
                                page, kv.num_pages));
    }
  }
}

// Checks q, out, lse and the options against the cache; returns the attention shape with M the
// longest sequence.
AttentionShape check_decode(TensorView<float> out, TensorView<float> lse, TensorView<const float> q, const PagedKV& kv,
                            const DecodeOptions& o) {
  check_paged(kv);
  if (q.rank() != 4)
    throw Error(fmt::format("decode_attention: q must be [B, H, N, D], got {}", shape_string(q.shape())));
  if (q.dim(0) != kv.batch())
    throw Error(fmt::format("decode_attention: q has B = {} but {} sequences were given", q.dim(0), kv.batch()));
  if (q.dim(3) != kv.D)
    throw Error(fmt::format("decode_attention: mismatched head dims: q has D = {}, the cache D = {}", q.dim(3), kv.D));
  if (!o.mask.key_lengths.empty())
    throw Error("decode_attention: mask.key_lengths must be empty (the sequence lengths are the key lengths)");
  require_scale(o.scale, "decode_attention");
  const int64_t M = kv.seq_lens.empty() ? 0 : *std::max_element(kv.seq_lens.begin(), kv.seq_lens.end());
  const std::array<int64_t, 4> ks{q.dim(0), kv.Hkv, M, kv.D}, vs{q.dim(0), kv.Hkv, M, kv.Dv};
  AttentionOptions ao;
  ao.scale = o.scale;
  ao.mask = o.mask;
  const AttentionShape s = check_attention_shapes(q.shape(), ks, vs, ao);
  const std::array<int64_t, 4> want_out{s.B, s.H, s.N, s.Dv};
  if (!std::ranges::equal(out.shape(), want_out))
    throw Error(fmt::format("decode_attention: out has shape {}, expected {}", shape_string(out.shape()),
                            shape_string(want_out)));
  const std::array<int64_t, 3> want_lse{s.B, s.H, s.N};
  if (!lse.empty() && !std::ranges::equal(lse.shape(), want_lse))
    throw Error(fmt::format("decode_attention: lse has shape {}, expected {}", shape_string(lse.shape()),
                            shape_string(want_lse)));
  if (!o.sinks.empty() && static_cast<int64_t>(o.sinks.size()) != s.H)
    throw Error(fmt::format("decode_attention: sinks has {} entries, expected one per query head (H = {})",
                            o.sinks.size(), s.H));
  for (std::size_t h = 0; h < o.sinks.size(); ++h)  // -inf: no sink for that head
    if (std::isnan(o.sinks[h]) || o.sinks[h] == std::numeric_limits<float>::infinity())
      throw Error(
          fmt::format("decode_attention: sinks[{}] = {} must be a finite logit or -inf (no sink)", h, o.sinks[h]));
  if (o.sink_tokens < 0) throw Error(fmt::format("decode_attention: sink_tokens = {} is negative", o.sink_tokens));
  return s;
}

// Names the cause of a non-finite decode result: a value of q, else an fp32 overflow.
void refuse_nonfinite_result(TensorView<const float> q) {
  for_each_element(q, [&](const float& x, const std::array<int64_t, 4>& i) {
    if (!std::isfinite(x))
      throw Error(fmt::format("decode_attention: q[{}, {}, {}, {}] = {} must be finite", i[0], i[1], i[2], i[3], x));
  });
  throw Error(
      "decode_attention: the output overflowed float32 although q and the cache are finite (scores or P·V sums "
      "beyond 3.4e38); scale q or the cached values down");
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

// Runs fn(i) for i in [0, n) on the threads asked for (resolve_num_threads); an exception (a
// failed scratch allocation) must not leave the OpenMP region, so it is reported after.
template <class Fn>
void parallel_for(int64_t n, int requested, const Fn& fn) {
  const int threads = resolve_num_threads(requested, n);
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  bool failed = false;
#pragma omp parallel for schedule(dynamic, 8) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) {
    try {
      fn(i);
    } catch (...) {
#pragma omp atomic write
      failed = true;
    }
  }
  if (failed) throw Error("decode_attention: cannot allocate the per-thread scratch buffers");
}

}  // namespace

void decode_attention(TensorView<float> out, TensorView<float> lse, TensorView<const float> q, const PagedKV& kv,
                      const DecodeOptions& options) {
  const AttentionShape s = check_decode(out, lse, q, kv, options);
  const Simd path = kernels::resolve_simd(options.simd);
  Mask mask = options.mask;
  mask.key_lengths = kv.seq_lens;
  const detail::MaskEval eval(mask, s);

  DecodeParams p;
  p.B = s.B, p.H = s.H, p.Hkv = s.Hkv, p.N = s.N, p.D = s.D, p.Dv = s.Dv, p.G = s.H / s.Hkv;
  p.dtype = kv.dtype;
  p.k = static_cast<const char*>(kv.k);
  p.v = static_cast<const char*>(kv.v);
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  p.page_tokens = kv.page_tokens;
  p.max_blocks = kv.max_blocks;
  p.block_table = kv.block_table.data();
  p.q = q.data();
  p.q_stride = kernels::strides_of(q);
  p.scale = static_cast<float>(options.scale.value_or(1.0 / std::sqrt(static_cast<double>(s.D))));
  p.mask = &eval;
  p.sink_tokens = options.sink_tokens;
  p.dvp = (s.Dv + 15) / 16 * 16;
  p.prefetch_keys = kernels::decode_prefetch_keys((s.D + s.Dv) * kv_dtype_bytes(kv.dtype));

  // The plan, and so every bit of the result, depends on the lengths alone; the order of the tasks
  // only on how the pool lays out a KV head's keys (parallel_for hands out runs of 8 tasks). Pages
  // of 256 tokens or more: (sequence, KV head, chunk), so a thread streams a run of one head's
  // keys (D1 M = 32768, 2 threads, cold: f16 -3..-9%, i8 -5..-7%; D2 contiguous -11%). Smaller
  // pages hold every head's rows of a few tokens side by side: (sequence, chunk, KV head) keeps a
  // page's rows together (D2 cold with 64-token pages 4% and with 16-token pages 5% faster than
  // the other order; 256-token pages the same either way).
  const bool head_major = kv.page_tokens >= 4 * kernels::kDecodeBlock;
  std::vector<ChunkPlan> plans(static_cast<std::size_t>(s.B));
  std::vector<int64_t> first_task(static_cast<std::size_t>(s.B) + 1, 0);
  for (int64_t b = 0; b < s.B; ++b) {
    plans[b] = plan_chunks(kv.seq_lens[b]);
    first_task[b + 1] = first_task[b] + plans[b].count * s.Hkv;
  }
  const int64_t tasks = first_task[s.B], rows = p.G * s.N;
  const int64_t task_floats = rows * (p.dvp + 2);
  float* partial =
      partial_workspace().get<float>(0, static_cast<std::size_t>(std::max<int64_t>(tasks * task_floats, 1)));
  // Task (b, g, c): sequence b's chunk c for KV head g, at index first_task[b] + g·count + c
  // (head-major) or + c·Hkv + g; the parallel loop below inverts that index.
  auto task = [&](int64_t b, int64_t g, int64_t c) {
    float* base = partial + (first_task[b] + (head_major ? g * plans[b].count + c : c * s.Hkv + g)) * task_floats;
    const int64_t j0 = c * plans[b].chunk;
    const int64_t j1 = std::min(j0 + plans[b].chunk, kv.seq_lens[b]);
    return DecodeTask{b,
                      g,
                      j0,
                      j1,
                      head_major ? std::min(j1 + p.prefetch_keys, kv.seq_lens[b]) : j1,
                      base,
                      base + rows * p.dvp,
                      base + rows * (p.dvp + 1)};
  };
  const kernels::DecodeChunkFn fn = kernels::kernel_family(path).decode_chunk;
  parallel_for(tasks, options.num_threads, [&](int64_t t) {
    const int64_t b = std::upper_bound(first_task.begin(), first_task.end(), t) - first_task.begin() - 1;
    const int64_t i = t - first_task[b], n = head_major ? plans[b].count : s.Hkv;
    const kernels::FlushSubnormals flush;
    fn(p, head_major ? task(b, i / n, i % n) : task(b, i % n, i / n), chunk_workspace());
  });

  // Merge: row (b, h, i) combines its chunks c = 0, 1, ... in order, in double. A chunk whose l is
  // NaN or m +inf, or an output that is not finite, can only come from a non-finite q or from
  // scores or P·V sums past fp32 (the cache holds finite values, sinks are checked): flagged here,
  // refused below, never merged into zeros.
  std::atomic<bool> nonfinite{false};
  parallel_for(s.B * s.H, options.num_threads, [&](int64_t bh) {
    const int64_t b = bh / s.H, h = bh % s.H, g = h / p.G;
    const double sink = options.sinks.empty() ? -std::numeric_limits<double>::infinity() : options.sinks[h];
    for (int64_t i = 0; i < s.N; ++i) {
      const int64_t r = (h - g * p.G) * s.N + i;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < plans[b].count; ++c) {
        const DecodeTask t = task(b, g, c);
        if (t.l[r] > 0.0f) mx = std::max<double>(mx, t.m[r]);
        if (std::isnan(t.l[r]) || std::isnan(t.m[r]) || t.m[r] == std::numeric_limits<float>::infinity())
          nonfinite.store(true, std::memory_order_relaxed);
      }
      float* o = out.data() + b * out.stride(0) + h * out.stride(1) + i * out.stride(2);
      float* l = lse.empty() ? nullptr : lse.data() + b * lse.stride(0) + h * lse.stride(1) + i * lse.stride(2);
      if (mx == -std::numeric_limits<double>::infinity()) {  // no key allowed
        for (int64_t e = 0; e < s.Dv; ++e) o[e * out.stride(3)] = 0.0f;
        if (l != nullptr) *l = -std::numeric_limits<float>::infinity();
        continue;
      }
      mx = std::max(mx, sink);
      double acc[512];  // Dv <= 512 per pass
      for (int64_t e0 = 0; e0 < s.Dv; e0 += 512) {
        const int64_t ne = std::min<int64_t>(512, s.Dv - e0);
        std::fill(acc, acc + ne, 0.0);
        double sum = std::exp(sink - mx);
        for (int64_t c = 0; c < plans[b].count; ++c) {
          const DecodeTask t = task(b, g, c);
          if (!(t.l[r] > 0.0f)) continue;
          const double w = std::exp(static_cast<double>(t.m[r]) - mx);
          sum += w * t.l[r];
          for (int64_t e = 0; e < ne; ++e) acc[e] += w * t.o[r * p.dvp + e0 + e];
        }
        bool bad = false;
        for (int64_t e = 0; e < ne; ++e) {
          o[(e0 + e) * out.stride(3)] = static_cast<float>(acc[e] / sum);
          bad |= !std::isfinite(o[(e0 + e) * out.stride(3)]);
        }
        if (bad) nonfinite.store(true, std::memory_order_relaxed);
        if (l != nullptr && e0 == 0) *l = static_cast<float>(mx + std::log(sum));
      }
    }
  });
  if (nonfinite.load()) refuse_nonfinite_result(q);
}

}  // namespace qkv
