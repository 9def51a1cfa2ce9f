// Google Benchmark of decode_attention against a KV cache (include/qkv/decode.h), at 1 and 2 threads, on
//   D1: B = 1, H = 32, Hkv = 8, D = 128, one query, M = 4096, 16384, 32768, per storage dtype, in a
//       contiguous cache (one page) and, at M = 32768, in pages of the cache's default size, each
//       cold step of those paired with one of the contiguous cache's, and each cold int8 step at
//       M >= 16384 with one of f16's (counter vs_partner_pct);
//   D8: 8 sequences of 4096 tokens in default-size pages (batched decode), f32, f16 and int8;
//   D2: 8 sequences of 1k-32k tokens, f16, in pages of 16, 64 and 256 tokens shuffled in the pool,
//       and the same tokens in contiguous caches (one page per sequence); 2 threads.
// Each other cold step is paired with a plain read of as many bytes from memory, read as the
// probe reads (counters read_pct, read_GBps): the host's memory drifts by a quarter between
// minutes, so a step is judged against the bandwidth of the same moment.
// Before any benchmark the same binary measures the ceilings at each thread count: the read
// bandwidth (probe_read_bandwidth, qkv/machine_info.h: the best of 1-8 streams per thread, median
// of 11 passes over memory_probe_bytes()) and the FMA peak (measure_peak: best of 5), recorded in
// the JSON's context; each step is reported as a percentage of its roofline bound
// max(bytes read / bandwidth, FLOPs / peak), the bytes decode_step_bytes's (kv_cache.h: K, V and
// the page table): counter roofline_pct (wall time).
// "cold": each step decodes the next of `layers` independent caches, as a model's step visits
// every layer's cache once, with enough of them that more than memory_probe_bytes() are read
// between two visits of one cache, so every step streams K and V from memory. "hot": one cache
// decoded again and again: where its bytes stay in cache (stays_in_cache, qkv/machine_info.h) the
// row has no roofline_pct, since the bound divides by memory's bandwidth, but in_cache = 1.
// On a machine shared with other jobs the threads get a fraction of their cores, so each step is
// also given per CPU second of the process (CPU time / threads standing for the time the threads
// ran): cpu_roofline_pct, the kernel's efficiency while it runs.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "core/huge_pages.h"
#include "decode_caches.h"
#include "fma_peak.h"
#include "qkv/kv_cache.h"
#include "qkv/machine.h"

namespace qkv::bench {
namespace {

// The ceilings at 1 and 2 threads (index = threads), measured once before the benchmarks.
double g_read_bandwidth[3] = {};  // bytes/s
double g_fma_peak[3] = {};        // flop/s
int g_read_streams[3] = {};       // the probe's best stream count per thread

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Wall and per-thread CPU seconds of a timed loop.
struct Timer {
  int threads;
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  double cpu = process_cpu_seconds();
  double wall_seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count(); }
  double thread_seconds() const { return (process_cpu_seconds() - cpu) / threads; }
};

void measure_ceilings() {
  const PeakIsa isa = best_peak_isa();
  for (int threads : {1, 2}) {
    const BandwidthProbe probe = probe_read_bandwidth(threads, memory_probe_bytes(), 11);
    g_read_bandwidth[threads] = probe.best;
    g_read_streams[threads] = probe.best_streams;
    g_fma_peak[threads] = measure_peak(threads, isa, 5, 0.2).best;
    const std::string t = std::to_string(threads);
    benchmark::AddCustomContext("read_bandwidth_threads_" + t, std::to_string(g_read_bandwidth[threads]));
    benchmark::AddCustomContext("fma_peak_threads_" + t, std::to_string(g_fma_peak[threads]));
  }
  benchmark::AddCustomContext("eviction_bytes", std::to_string(memory_probe_bytes()));
  benchmark::AddCustomContext("default_page_tokens", std::to_string(KVCacheConfig{}.page_tokens));
}

// The caches a benchmark decodes in turn: one (hot) or enough that more than memory_probe_bytes()
// are read between two visits of one (cold). Built once per name and kept while Google Benchmark
// calls the benchmark again (repetitions) and while the next thread count or a paired benchmark
// (which alternates with a set built before it) uses it: the three sets used last are kept, the
// others freed. A list, so a set stays where it is while others come and go (a paired benchmark
// holds its partner's while asking for its own).
const std::vector<Setup>& layers(const std::string& name, KVDtype dtype, const std::vector<int64_t>& lens,
                                 int64_t page_tokens, bool shuffled, bool cold) {
  static std::list<std::pair<std::string, std::vector<Setup>>> kept;  // least recently used first
  for (auto it = kept.begin(); it != kept.end(); ++it)
    if (it->first == name) {
      kept.splice(kept.end(), kept, it);
      return it->second;
    }
  if (kept.size() == 3) kept.pop_front();
  const int count = cold ? cold_layers(dtype, lens, page_tokens) : 1;
  std::vector<Setup> caches;
  for (int layer = 0; layer < count; ++layer) caches.push_back(make_cache(dtype, lens, page_tokens, shuffled, layer));
  kept.emplace_back(name, std::move(caches));
  return kept.back().second;
}

// One set of caches, the one a step decodes next.
struct Stepper {
  std::vector<PagedKV> kv;
  std::size_t next = 0;
  const PagedKV& take() {
    const PagedKV& c = kv[next];
    next = next + 1 == kv.size() ? 0 : next + 1;
    return c;
  }
};

Stepper stepper(const std::vector<Setup>& caches) {
  Stepper s;
  for (const Setup& c : caches) s.kv.push_back(c.cache->paged(c.ids));
  return s;
}

// A plain read of about a step's bytes from memory, as the probe reads (streaming_sum with its
// best stream count): windows of one buffer in turn, the buffer memory_probe_bytes() longer than a
// window, so more than that is read between two visits of one window. Allocated as the pools are.
class PlainRead {
 public:
  PlainRead(double bytes, int threads)
      : threads_(threads), streams_(g_read_streams[threads]), window_(window(bytes, threads)) {
    windows_ = 1 + (memory_probe_bytes() / static_cast<int64_t>(sizeof(float)) + window_ - 1) / window_;
    buffer_ = std::make_unique<detail::HugePageFloats>(window_ * windows_, "decode bench plain read");
    std::fill(buffer_->data(), buffer_->data() + window_ * windows_, 1.0f);  // not the shared zero page
  }
  bool fits(double bytes, int threads) const { return threads == threads_ && window(bytes, threads) == window_; }
  // Reads the next window; returns the bytes read.
  double next() {
    benchmark::DoNotOptimize(streaming_sum(buffer_->data() + window_ * at_, window_, threads_, streams_));
    at_ = at_ + 1 == windows_ ? 0 : at_ + 1;
    return static_cast<double>(window_) * sizeof(float);
  }

 private:
  // Floats per read: `bytes` rounded down to streaming_sum's granularity.
  static int64_t window(double bytes, int threads) {
    const int64_t unit = int64_t{64} * g_read_streams[threads] * threads;
    return std::max(unit, static_cast<int64_t>(bytes / sizeof(float)) / unit * unit);
  }
  int threads_, streams_;
  int64_t window_, windows_ = 0, at_ = 0;
  std::unique_ptr<detail::HugePageFloats> buffer_;
};

// The PlainRead for a step of `bytes` on `threads`: the last one made, while it fits (Google
// Benchmark calls a benchmark several times, and writing the buffer takes a while).
PlainRead& plain_read(double bytes, int threads) {
  static std::unique_ptr<PlainRead> kept;
  if (!kept || !kept->fits(bytes, threads)) {
    kept.reset();  // the old buffer freed before the new one is written
    kept = std::make_unique<PlainRead>(bytes, threads);
  }
  return *kept;
}

// Steps through `caches` and reports each step against its roofline bound. A cold step is paired:
// with `partner` (a set holding the same tokens another way) each iteration also takes a step of
// the partner, without one a PlainRead of as many bytes; the two in alternating order, and only
// the own step timed (manual time). vs_partner_pct is the median over iterations of own / partner
// - 1; read_pct the median of the step's bytes per second as a % of the read's, read_GBps the
// read's median. A pair is a few milliseconds apart, so a drift of the host's memory between
// minutes moves both sides alike.
void run_decode(benchmark::State& state, const std::vector<Setup>& caches, int threads, bool cold,
                const std::vector<Setup>* partner = nullptr) {
  const int64_t B = static_cast<int64_t>(caches[0].ids.size());
  std::vector<float> q(B * kH * kD), out(B * kH * kD);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  for (float& x : q) x = dist(rng);
  if (partner != nullptr && (partner->empty() || (*partner)[0].tokens != caches[0].tokens)) {
    state.SkipWithError("the partner set does not hold this set's tokens");
    return;
  }
  Stepper own = stepper(caches), other = partner ? stepper(*partner) : Stepper{};
  const double bytes = caches[0].step_bytes;
  PlainRead* read = cold && !partner ? &plain_read(bytes, threads) : nullptr;
  DecodeOptions o;
  o.attention.num_threads = threads;
  o.attention.mask.causal = CausalAlign::bottom_right;
  const TensorView<const float> qv(q.data(), {B, kH, 1, kD});
  const TensorView<float> ov(out.data(), {B, kH, 1, kD});
  for (const PagedKV& c : own.kv) decode_attention(ov, TensorView<float>(), qv, c, o);  // warm the threads and scratch
  for (const PagedKV& c : other.kv) decode_attention(ov, TensorView<float>(), qv, c, o);
  if (read) read->next();
  const bool paired = partner || read;
  const Timer timer{threads};
  double wall = 0, cpu = 0;              // the own steps', when paired
  std::vector<double> ratios, read_pct;  // own / partner seconds; own bytes/s as a % of the read's
  std::vector<double> read_rates;        // the read's bytes/s
  for (auto _ : state) {
    if (!paired) {
      decode_attention(ov, TensorView<float>(), qv, own.take(), o);
      continue;
    }
    double seconds[2] = {}, read_bytes = 0;
    for (int turn = 0; turn < 2; ++turn) {
      const bool mine = (turn == 0) == (ratios.size() % 2 == 0);
      const Timer t{threads};
      if (mine || partner)
        decode_attention(ov, TensorView<float>(), qv, mine ? own.take() : other.take(), o);
      else
        read_bytes = read->next();
      seconds[mine ? 0 : 1] = t.wall_seconds();
      if (mine) cpu += t.thread_seconds();
    }
    state.SetIterationTime(seconds[0]);
    wall += seconds[0];
    ratios.push_back(seconds[0] / seconds[1]);
    if (read) {
      read_rates.push_back(read_bytes / seconds[1]);
      read_pct.push_back(100.0 * bytes / seconds[0] / read_rates.back());
    }
  }
  const double iterations = static_cast<double>(state.iterations());
  const double step = (paired ? wall : timer.wall_seconds()) / iterations;
  const double cpu_step = (paired ? cpu : timer.thread_seconds()) / iterations;
  const double flops = 4.0 * static_cast<double>(caches[0].tokens) * kH * kD;
  const double bound = std::max(bytes / g_read_bandwidth[threads], flops / g_fma_peak[threads]);
  // A hot step whose cache stays in the L3 reads at the cache's rate, which no probe here measures:
  // its row keeps GB/s and drops the % of a bound from memory's bandwidth (counter in_cache).
  if (!cold && stays_in_cache(bytes)) {
    state.counters["in_cache"] = 1;
  } else {
    state.counters["roofline_pct"] = 100.0 * bound / step;
    state.counters["cpu_roofline_pct"] = 100.0 * bound / cpu_step;
  }
  state.counters["GBps"] = bytes / step / 1e9;
  state.counters["cpu_us"] = cpu_step * 1e6;
  state.counters["bound_us"] = bound * 1e6;
  // What one step reads and computes, for bench/targets.py's ceilings against its own peaks.
  state.counters["step_bytes"] = bytes;
  state.counters["step_flops"] = flops;
  state.counters["layers"] = static_cast<double>(own.kv.size());
  if (partner && !ratios.empty()) state.counters["vs_partner_pct"] = 100.0 * (median(ratios) - 1.0);
  if (read && !read_rates.empty()) {
    state.counters["read_pct"] = median(read_pct);
    state.counters["read_GBps"] = median(read_rates) / 1e9;
  }
}

void register_all() {
  auto add = [](const std::string& name, bool manual_time, auto fn) {
    auto* b = benchmark::RegisterBenchmark(name.c_str(), fn);
    if (manual_time)
      b->UseManualTime();
    else
      b->UseRealTime();
    return b->Unit(benchmark::kMicrosecond)->Repetitions(3)->ReportAggregatesOnly(true);
  };
  // Each shape cold (streamed from memory, the target) and, at 2 threads, hot (one cache, partly in
  // L3). Each cold step is paired (run_decode) with one of its partner's (the same tokens in other
  // pages or another storage type) or, without one, with a plain read. A set of caches is named by
  // its shape and temperature, so the thread counts and a pair share it.
  struct Partner {
    std::string shape;
    KVDtype dtype;
    int64_t page_tokens;
  };
  auto add_decode = [&add](const std::string& shape, KVDtype dtype, const std::vector<int64_t>& lens,
                           int64_t page_tokens, bool shuffled, std::vector<int> thread_counts,
                           std::optional<Partner> partner = std::nullopt) {
    for (int threads : thread_counts)
      for (bool cold : {true, false}) {
        if (!cold && threads == 1) continue;
        const std::string temperature = cold ? "/cold" : "/hot";
        const std::string set = "decode/" + shape + temperature;
        add(set + "/threads:" + std::to_string(threads), cold, [=](benchmark::State& state) {
          const std::vector<Setup>* other = cold && partner
                                                ? &layers("decode/" + partner->shape + temperature, partner->dtype,
                                                          lens, partner->page_tokens, false, cold)
                                                : nullptr;
          run_decode(state, layers(set, dtype, lens, page_tokens, shuffled, cold), threads, cold, other);
        });
      }
  };
  const int64_t page = KVCacheConfig{}.page_tokens;
  const std::string paged = "/paged" + std::to_string(page);
  for (KVDtype dtype : {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8}) {
    const std::string d = kv_dtype_name(dtype);
    for (int64_t M : {4096, 16384, 32768}) {  // contiguous: one page
      const std::string shape = "D1/" + d + "/M:" + std::to_string(M);
      // int8 at M >= 16k against f16, step by step (the int8 target is f16's step time over int8's).
      std::optional<Partner> f16;
      if (dtype == KVDtype::i8 && M >= 16384) f16 = Partner{"D1/f16/M:" + std::to_string(M), KVDtype::f16, M};
      add_decode(shape, dtype, {M}, M, false, {1, 2}, f16);
    }
    // The default pages against the contiguous cache, step by step.
    add_decode("D1/" + d + "/M:32768" + paged, dtype, {32768}, page, false, {1, 2},
               Partner{"D1/" + d + "/M:32768", dtype, 32768});
  }
  for (KVDtype dtype : {KVDtype::f32, KVDtype::f16, KVDtype::i8})
    add_decode(std::string("D8/") + kv_dtype_name(dtype) + paged, dtype, std::vector<int64_t>(8, 4096), page, false,
               {1, 2});
  const std::vector<int64_t> d2{1024, 2048, 4096, 6144, 8192, 16384, 24576, 32768};
  // Shuffled pages of several sizes: what a page costs beyond its tokens (docs/benchmarks.md).
  for (int64_t page_tokens : {16, 64, 256})
    add_decode("D2/f16/paged" + std::to_string(page_tokens) + "_shuffled", KVDtype::f16, d2, page_tokens, true, {2});
  // One page per sequence; the pool is mapped lazily, so only the filled part is resident.
  add_decode("D2/f16/contiguous", KVDtype::f16, d2, 32768, false, {2});
}

}  // namespace
}  // namespace qkv::bench

int main(int argc, char** argv) {
  qkv::bench::register_all();
  benchmark::Initialize(&argc, argv);
  qkv::bench::measure_ceilings();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
