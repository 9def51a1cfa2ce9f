// Google Benchmark of the fused attention forward on the benchmark shapes S1-S6 (bench/shapes.h) (fp32, and bf16 for
// S3/S4), with 1 and 2 threads, each thread group preceded by the FMA peak measured the same way.
// `qkv_bench --peak-memory` instead runs S6 once and prints its peak resident memory growth;
// `qkv_bench --avx2` runs the AVX2 path alone (S3, S4 fp32 and its micro-kernels) against the
// AVX2 FMA peak, for CPUs without AVX-512.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <algorithm>
#include <vector>

#include "fma_peak.h"
#include "shapes.h"
#include "qkv/attention.h"

namespace qkv::bench {

void register_microkernels();       // microkernel_bench.cpp
void register_microkernels_avx2();  // microkernel_avx2_bench.cpp

namespace {

// The forward's FLOPs: 4·B·H·N²·D (half under a causal mask).
double flops_of(const Shape& s) { return flops_of(s, 4.0); }

// Inputs of one shape, created on first use and kept (the benchmarks reuse them).
struct Inputs {
  std::array<int64_t, 4> shape;
  std::vector<float> q, k, v, out, lse;
  std::vector<bf16> qb, kb, vb;
};

Inputs& inputs_of(const Shape& s) {
  static std::map<std::string, Inputs> cache;
  auto it = cache.find(s.name);
  if (it != cache.end()) return it->second;
  Inputs& in = cache[s.name];
  in.shape = {s.B, s.H, s.N, s.D};
  draw_inputs(s, in.q, in.k, in.v);
  in.out.assign(in.q.size(), 0.0f);
  in.lse.assign(static_cast<std::size_t>(s.B * s.H * s.N), 0.0f);
  auto to_bf16 = [](const std::vector<float>& f) {
    std::vector<bf16> b(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16(f[i]);
    return b;
  };
  in.qb = to_bf16(in.q);
  in.kb = to_bf16(in.k);
  in.vb = to_bf16(in.v);
  return in;
}

void run_once(const Shape& s, Inputs& in, bool use_bf16, int threads, Simd simd = Simd::automatic) {
  AttentionOptions options;
  options.num_threads = threads;
  options.simd = simd;
  if (s.causal) options.mask.causal = CausalAlign::top_left;
  const std::array<int64_t, 3> lse_shape{s.B, s.H, s.N};
  TensorView<float> out(in.out.data(), in.shape), lse(in.lse.data(), lse_shape);
  if (use_bf16) {
    attention_forward(out, lse, TensorView<const bf16>(in.qb.data(), in.shape),
                      TensorView<const bf16>(in.kb.data(), in.shape), TensorView<const bf16>(in.vb.data(), in.shape),
                      options);
  } else {
    attention_forward(out, lse, TensorView<const float>(in.q.data(), in.shape),
                      TensorView<const float>(in.k.data(), in.shape), TensorView<const float>(in.v.data(), in.shape),
                      options);
  }
}

// CPU seconds used so far by all threads of this process. On a machine shared with other jobs,
// flops / (CPU seconds / threads) estimates the speed the threads have while they run, which
// wall time cannot show when the cores are oversubscribed.
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

void set_cpu_counter(benchmark::State& state, double cpu_start, int threads) {
  state.counters["cpu_rate_threads"] = threads;
  state.counters["cpu_s_per_iter"] = (process_cpu_seconds() - cpu_start) / static_cast<double>(state.iterations());
}

// The peak of `isa` on `threads` threads, as benchmark `name`; its "max" aggregate is the best
// repetition, the ceiling (other load only ever lowers a run).
void register_peak(const std::string& name, int threads, PeakIsa isa) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [threads, isa](benchmark::State& state) {
                                 constexpr int64_t kIterations = 20'000'000;
                                 double flops = 0;
                                 const double cpu = process_cpu_seconds();
                                 for (auto _ : state) flops = qkv::fma_peak_work(threads, kIterations, isa);
                                 set_cpu_counter(state, cpu, threads);
                                 state.counters["flops_per_iter"] = flops;
                                 state.counters["FLOPS"] =
                                     benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
                               })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(5)
      ->ComputeStatistics("max", [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); })
      ->ReportAggregatesOnly(true);
}

// The forward of `shape` on SIMD path `simd`, as benchmark `prefix`<shape>/<dtype>/threads:<threads>.
void register_shape(const std::string& prefix, const Shape& shape, bool use_bf16, int threads, Simd simd) {
  const std::string name = prefix + shape.name + (use_bf16 ? "/bf16" : "/fp32") + "/threads:" + std::to_string(threads);
  benchmark::RegisterBenchmark(name.c_str(),
                               [shape, use_bf16, threads, simd](benchmark::State& state) {
                                 Inputs& in = inputs_of(shape);
                                 run_once(shape, in, use_bf16, threads, simd);  // warm the thread pool and buffers
                                 const double cpu = process_cpu_seconds();
                                 for (auto _ : state) run_once(shape, in, use_bf16, threads, simd);
                                 set_cpu_counter(state, cpu, threads);
                                 state.counters["flops_per_iter"] = flops_of(shape);
                                 state.counters["FLOPS"] =
                                     benchmark::Counter(flops_of(shape), benchmark::Counter::kIsIterationInvariantRate);
                               })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(5)
      ->ReportAggregatesOnly(true);
}

bool is_s3_or_s4(const Shape& shape) {
  return std::strcmp(shape.name, "S3") == 0 || std::strcmp(shape.name, "S4") == 0;
}

// The FMA peak is timed before a thread count's rows and again after them (<prefix>fma_peak/after/):
// the host can lend a binary less in its later minutes than at its start (bench/bench_results.py).
void register_group(int threads) {
  const std::string t = "/threads:" + std::to_string(threads);
  register_peak("fma_peak" + t, threads, best_peak_isa());
  // What the bf16 forward's products run on (AMX tiles or vdpbf16ps), where the CPU has it: the
  // same for S3 and S4 (both of head dim 64).
  const PeakIsa bf16 = bf16_product_isa(64, 64);
  if (peak_isa_available(bf16)) register_peak("bf16_peak" + t, threads, bf16);
  for (const Shape& shape : kShapes) register_shape("attention/", shape, false, threads, Simd::automatic);
  for (const Shape& shape : kShapes)
    if (is_s3_or_s4(shape)) register_shape("attention/", shape, true, threads, Simd::automatic);
  register_peak("fma_peak/after" + t, threads, best_peak_isa());
}

// The AVX2 path on the shapes with N >= 1024 (S3, S4), held to the AVX2 FMA peak.
void register_avx2_group(int threads) {
  const std::string t = "/threads:" + std::to_string(threads);
  register_peak("avx2/fma_peak" + t, threads, PeakIsa::avx2);
  for (const Shape& shape : kShapes)
    if (is_s3_or_s4(shape)) register_shape("avx2/attention/", shape, false, threads, Simd::avx2);
  register_peak("avx2/fma_peak/after" + t, threads, PeakIsa::avx2);
}

long status_kb(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  return -1;
}

// S6 once on 2 threads after its inputs and outputs are resident; VmHWM is reset just before.
int peak_memory() {
  const Shape& s6 = kShapes[5];
  Inputs& in = inputs_of(s6);
  in.qb.clear(), in.kb.clear(), in.vb.clear();
  in.qb.shrink_to_fit(), in.kb.shrink_to_fit(), in.vb.shrink_to_fit();
  run_once(kShapes[0], inputs_of(kShapes[0]), false, 2);  // start the OpenMP threads first
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  const bool reset = f != nullptr && std::fputs("5", f) >= 0;
  if (f != nullptr) std::fclose(f);
  const long before = status_kb("VmHWM:");
  run_once(s6, in, false, 2);
  const long after = status_kb("VmHWM:");
  const double io_mb = (in.q.size() * 4.0 * 4 + in.lse.size() * 4.0) / (1 << 20);
  std::printf(
      "{\"shape\": \"S6\", \"threads\": 2, \"reset_ok\": %s, \"rss_before_mb\": %.1f, "
      "\"peak_growth_mb\": %.2f, \"inputs_outputs_mb\": %.1f}\n",
      reset ? "true" : "false", before / 1024.0, (after - before) / 1024.0, io_mb);
  return reset ? 0 : 1;
}

}  // namespace
}  // namespace qkv::bench

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--peak-memory") == 0) return qkv::bench::peak_memory();
  if (argc > 1 && std::strcmp(argv[1], "--avx2") == 0) {
    if (!qkv::peak_isa_available(qkv::PeakIsa::avx2)) {
      std::fprintf(stderr, "qkv_bench --avx2: this CPU has no AVX2 with FMA\n");
      return 2;
    }
    argv[1] = argv[0];  // Google Benchmark parses the rest
    ++argv, --argc;
    qkv::bench::register_avx2_group(1);
    qkv::bench::register_microkernels_avx2();
    qkv::bench::register_avx2_group(2);
  } else {
    qkv::bench::register_group(1);
    qkv::bench::register_microkernels();
    qkv::bench::register_group(2);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
