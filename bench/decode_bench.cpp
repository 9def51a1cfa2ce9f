// Google Benchmark of decode_attention against a paged KV cache (include/qkv/decode.h), on
//   D1: B = 1, H = 32, Hkv = 8, D = 128, one query, M = 4096, 16384, 32768, per storage dtype;
//   D2: 8 sequences of 1k-32k tokens, f16, in pages of 16 (the target), 64 and 256 tokens shuffled
//       in the pool, and the same tokens in contiguous caches (one page per sequence).
// The same binary first measures the machine's read bandwidth (a read-only streaming sum over
// memory_probe_bytes(), qkv/machine.h: 2x the L3, at least 256 MiB) and its FMA peak
// (fma_peak.h), then reports each step as a percentage of the roofline bound
// max(K+V bytes / bandwidth, FLOPs / peak): counter roofline_pct (wall time).
// "cold": each step decodes the next of `layers` independent caches, as a model's step visits
// every layer's cache once, with enough of them that more than memory_probe_bytes() are read
// between two visits of one cache, so every step streams K and V from memory. "hot": one cache
// decoded again and again (what fits in the L3 stays there).
// On a machine shared with other jobs the threads get a fraction of their cores, so each rate is
// also given per CPU second of the process (CPU time / threads standing for the time the threads
// ran), and cpu_roofline_pct compares those: the kernel's efficiency while it runs.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "fma_peak.h"
#include "core/huge_pages.h"
#include "qkv/kv_cache.h"
#include "qkv/machine.h"

namespace qkv::bench {
namespace {

constexpr int kThreads = 2;
constexpr int64_t kH = 32, kHkv = 8, kD = 128;

double g_read_bandwidth = 0;      // bytes/s, set by the bandwidth benchmark
double g_fma_peak = 0;            // flop/s
double g_cpu_read_bandwidth = 0;  // the same per CPU second of each thread
double g_cpu_fma_peak = 0;

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Wall and per-thread CPU seconds of a timed loop.
struct Timer {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  double cpu = process_cpu_seconds();
  double wall_seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count(); }
  double thread_seconds() const { return (process_cpu_seconds() - cpu) / kThreads; }
};

void read_bandwidth(benchmark::State& state) {
  const int64_t n = memory_probe_bytes() / 4 / (64 * kThreads) * (64 * kThreads);
  const detail::HugePageFloats buf(n, "read_bandwidth buffer");  // as the cache's pools are
  std::fill(buf.data(), buf.data() + n, 1.0f);
  float sink = 0;
  const Timer timer;
  for (auto _ : state) sink += streaming_sum(buf.data(), n, kThreads);
  benchmark::DoNotOptimize(sink);
  const double bytes = static_cast<double>(n) * 4 * static_cast<double>(state.iterations());
  const double rate = bytes / timer.wall_seconds(), cpu_rate = bytes / timer.thread_seconds();
  // The best run: the bound is what the machine can do.
  g_read_bandwidth = std::max(g_read_bandwidth, rate);
  g_cpu_read_bandwidth = std::max(g_cpu_read_bandwidth, cpu_rate);
  state.counters["GBps"] = rate / 1e9;
  state.counters["cpu_GBps"] = cpu_rate / 1e9;
}

void fma_peak(benchmark::State& state) {
  double flops = 0;
  const Timer timer;
  for (auto _ : state) flops = fma_peak_work(kThreads, 20'000'000);
  const double total = flops * static_cast<double>(state.iterations());
  const double rate = total / timer.wall_seconds(), cpu_rate = total / timer.thread_seconds();
  g_fma_peak = std::max(g_fma_peak, rate);
  g_cpu_fma_peak = std::max(g_cpu_fma_peak, cpu_rate);
  state.counters["GFLOPS"] = rate / 1e9;
  state.counters["cpu_GFLOPS"] = cpu_rate / 1e9;
}

// A cache holding sequences of the given lengths; shuffled: its pages are taken from the pool in
// a random order (as after many sequences came and went).
struct Setup {
  std::unique_ptr<KVCache> cache;
  std::vector<int64_t> ids;
  int64_t tokens = 0;
};

constexpr int64_t kPiece = 1024;  // tokens appended at a time
constexpr int kPieces = 8;        // distinct random pieces, reused (drawing 1 GB took longer than the run)

// kPieces pieces of K or V, uniform in [-2, 2) from the top bits of one 64-bit draw each.
std::vector<float> random_pieces(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(static_cast<std::size_t>(kPieces * kPiece * kHkv * kD));
  for (float& e : x) e = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1p-51 - 2.0);
  return x;
}

Setup make_cache(KVDtype dtype, const std::vector<int64_t>& lens, int64_t page_tokens, bool shuffled, int layer) {
  static const std::vector<float> k_pieces = random_pieces(7), v_pieces = random_pieces(8);
  Setup s;
  int64_t pages = 0;
  for (int64_t len : lens) pages += (len + page_tokens - 1) / page_tokens;
  s.cache = std::make_unique<KVCache>(KVCacheConfig{pages, page_tokens, kHkv, kD, kD, dtype});
  if (shuffled) {
    std::mt19937_64 rng(100 + layer);
    std::vector<int64_t> decoys(static_cast<std::size_t>(pages));
    std::vector<float> one(kHkv * kD, 0.0f);
    const TensorView<const float> row(one.data(), {1, kHkv, kD});
    for (int64_t& d : decoys) {
      d = s.cache->create();
      s.cache->append(d, row, row);
    }
    std::shuffle(decoys.begin(), decoys.end(), rng);
    for (int64_t d : decoys) s.cache->free(d);
  }
  int64_t piece = layer;
  for (int64_t len : lens) {
    const int64_t id = s.cache->create();
    s.ids.push_back(id);
    for (int64_t t = 0; t < len; t += kPiece, ++piece) {
      const int64_t T = std::min(kPiece, len - t), at = piece % kPieces * kPiece * kHkv * kD;
      s.cache->append(id, TensorView<const float>(k_pieces.data() + at, {T, kHkv, kD}),
                      TensorView<const float>(v_pieces.data() + at, {T, kHkv, kD}));
    }
    s.tokens += len;
  }
  return s;
}

// K and V bytes one decode step reads from a cache of `tokens` tokens (int8: with its scales).
double kv_bytes(KVDtype dtype, int64_t tokens) {
  return static_cast<double>(tokens) * kHkv *
         (2.0 * kD * static_cast<double>(kv_dtype_bytes(dtype)) + (dtype == KVDtype::i8 ? 8.0 : 0.0));
}

// The caches a benchmark decodes in turn: one (hot) or enough that more than memory_probe_bytes()
// are read between two visits of one (cold). Built once per benchmark name and kept while
// Google Benchmark calls the benchmark again (repetitions), freed when the next one starts.
const std::vector<Setup>& layers(const std::string& name, KVDtype dtype, const std::vector<int64_t>& lens,
                                 int64_t page_tokens, bool shuffled, bool cold) {
  static std::string built;
  static std::vector<Setup> caches;
  if (built != name) {
    caches.clear();
    int64_t tokens = 0;
    for (int64_t len : lens) tokens += len;
    const double probe = static_cast<double>(memory_probe_bytes());
    const int count = cold ? 1 + static_cast<int>(std::ceil(probe / kv_bytes(dtype, tokens))) : 1;
    for (int layer = 0; layer < count; ++layer) caches.push_back(make_cache(dtype, lens, page_tokens, shuffled, layer));
    built = name;
  }
  return caches;
}

void run_decode(benchmark::State& state, const std::vector<Setup>& caches) {
  const int64_t B = static_cast<int64_t>(caches[0].ids.size());
  std::vector<float> q(B * kH * kD), out(B * kH * kD);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  for (float& x : q) x = dist(rng);
  std::vector<PagedKV> kv;
  for (const Setup& s : caches) kv.push_back(s.cache->paged(s.ids));
  DecodeOptions o;
  o.attention.num_threads = kThreads;
  o.attention.mask.causal = CausalAlign::bottom_right;
  const TensorView<const float> qv(q.data(), {B, kH, 1, kD});
  const TensorView<float> ov(out.data(), {B, kH, 1, kD});
  for (const PagedKV& c : kv) decode_attention(ov, TensorView<float>(), qv, c, o);  // warm the threads and scratch
  std::size_t next = 0;
  const Timer timer;
  for (auto _ : state) {
    decode_attention(ov, TensorView<float>(), qv, kv[next], o);
    next = next + 1 == kv.size() ? 0 : next + 1;
  }
  const double iterations = static_cast<double>(state.iterations());
  const double step = timer.wall_seconds() / iterations, cpu_step = timer.thread_seconds() / iterations;
  const double bytes = kv_bytes(caches[0].cache->config().dtype, caches[0].tokens);
  const double flops = 4.0 * static_cast<double>(caches[0].tokens) * kH * kD;
  const double bound = std::max(bytes / g_read_bandwidth, flops / g_fma_peak);
  const double cpu_bound = std::max(bytes / g_cpu_read_bandwidth, flops / g_cpu_fma_peak);
  state.counters["roofline_pct"] = 100.0 * bound / step;
  state.counters["cpu_roofline_pct"] = 100.0 * cpu_bound / cpu_step;
  state.counters["GBps"] = bytes / step / 1e9;
  state.counters["cpu_us"] = cpu_step * 1e6;
  state.counters["bound_us"] = bound * 1e6;
  state.counters["layers"] = static_cast<double>(kv.size());
}

void register_all() {
  auto add = [](const std::string& name, auto fn) {
    return benchmark::RegisterBenchmark(name.c_str(), fn)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond)
        ->Repetitions(3)
        ->ReportAggregatesOnly(true);
  };
  add("read_bandwidth/threads:2", read_bandwidth);
  add("fma_peak/threads:2", fma_peak);
  // Each shape cold (streamed from memory, the target) and hot (one cache, partly in L3).
  auto add_decode = [&add](const std::string& shape, KVDtype dtype, const std::vector<int64_t>& lens,
                           int64_t page_tokens, bool shuffled) {
    for (bool cold : {true, false}) {
      const std::string name = "decode/" + shape + (cold ? "/cold" : "/hot") + "/threads:2";
      add(name,
          [=](benchmark::State& state) { run_decode(state, layers(name, dtype, lens, page_tokens, shuffled, cold)); });
    }
  };
  for (KVDtype dtype : {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8})
    for (int64_t M : {4096, 16384, 32768})  // contiguous: one page
      add_decode(std::string("D1/") + kv_dtype_name(dtype) + "/M:" + std::to_string(M), dtype, {M}, M, false);
  const std::vector<int64_t> d2{1024, 2048, 4096, 6144, 8192, 16384, 24576, 32768};
  // The target's shape, and larger pages: what a page costs beyond its tokens (docs/benchmarks.md).
  for (int64_t page_tokens : {16, 64, 256})
    add_decode("D2/f16/paged" + std::to_string(page_tokens) + "_shuffled", KVDtype::f16, d2, page_tokens, true);
  // One page per sequence; the pool is mapped lazily, so only the filled part is resident.
  add_decode("D2/f16/contiguous", KVDtype::f16, d2, 32768, false);
}

}  // namespace
}  // namespace qkv::bench

int main(int argc, char** argv) {
  qkv::bench::register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
