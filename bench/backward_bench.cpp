// Google Benchmark of the fused attention backward on the forward's shapes S2-S6 (fp32), with 1
// and 2 threads, each thread group preceded by the FMA peak measured the same way. FLOPs follow the
// forward's convention: 10·B·H·N·M·D (the five block products), half of it under a causal mask.
// Besides FLOPS (per wall-clock second), CPU_FLOPS counts per CPU-second of the whole process (all
// threads): on a shared machine wall time measures the load, CPU time the kernel.
// `qkv_backward_bench --avx2` runs the AVX2 path alone (S3, S4) against the AVX2 FMA peak.
#include <benchmark/benchmark.h>

#include <time.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <algorithm>
#include <vector>

#include "fma_peak.h"
#include "shapes.h"
#include "qkv/backward.h"

namespace qkv::bench {
namespace {

// The backward's FLOPs: 10·B·H·N²·D (five block products; half under a causal mask).
double flops_of(const Shape& s) { return flops_of(s, 10.0); }

AttentionOptions options_of(const Shape& s, int threads, Simd simd = Simd::automatic) {
  AttentionOptions options;
  options.num_threads = threads;
  options.simd = simd;
  if (s.causal) options.mask.causal = CausalAlign::top_left;
  return options;
}

// Inputs, the forward's out and lse, and gradient buffers of one shape, made on first use.
struct Problem {
  std::array<int64_t, 4> shape;
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;
};

Problem& problem_of(const Shape& s) {
  static std::map<std::string, Problem> cache;
  auto it = cache.find(s.name);
  if (it != cache.end()) return it->second;
  Problem& p = cache[s.name];
  p.shape = {s.B, s.H, s.N, s.D};
  const std::size_t n = static_cast<std::size_t>(s.B * s.H * s.N * s.D);
  draw_inputs(s, p.q, p.k, p.v, &p.dout);
  for (auto* t : {&p.out, &p.dq, &p.dk, &p.dv}) t->assign(n, 0.0f);
  p.lse.assign(static_cast<std::size_t>(s.B * s.H * s.N), 0.0f);
  const std::array<int64_t, 3> lse_shape{s.B, s.H, s.N};
  attention_forward(TensorView<float>(p.out.data(), p.shape), TensorView<float>(p.lse.data(), lse_shape),
                    TensorView<const float>(p.q.data(), p.shape), TensorView<const float>(p.k.data(), p.shape),
                    TensorView<const float>(p.v.data(), p.shape), options_of(s, 2));
  return p;
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Runs the benchmark loop; `body` returns the flops of one call. Sets FLOPS and CPU_FLOPS.
template <class Body>
void measure(benchmark::State& state, Body body) {
  double done = 0;
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) done += body();
  const double cpu = process_cpu_seconds() - cpu0;
  state.counters["FLOPS"] = benchmark::Counter(done, benchmark::Counter::kIsRate);
  state.counters["CPU_FLOPS"] = cpu > 0 ? done / cpu : 0.0;
}

void run_once(const Shape& s, Problem& p, int threads, Simd simd) {
  const std::array<int64_t, 3> lse_shape{s.B, s.H, s.N};
  auto in = [&](std::vector<float>& t) { return TensorView<const float>(t.data(), p.shape); };
  auto grad = [&](std::vector<float>& t) { return TensorView<float>(t.data(), p.shape); };
  attention_backward(grad(p.dq), grad(p.dk), grad(p.dv), {}, in(p.dout), in(p.q), in(p.k), in(p.v), in(p.out),
                     TensorView<const float>(p.lse.data(), lse_shape), options_of(s, threads, simd));
}

// The FMA peak of `isa` on `threads` threads, as benchmark `name`; its "max" aggregate is the best
// repetition, the ceiling (other load only ever lowers a run).
void register_peak(const std::string& name, int threads, PeakIsa isa) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [threads, isa](benchmark::State& state) {
                                 measure(state,
                                         [threads, isa] { return qkv::fma_peak_work(threads, 20'000'000, isa); });
                               })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(5)
      ->ComputeStatistics("max", [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); })
      ->ReportAggregatesOnly(true);
}

// The FMA peak of `isa` and the backward of the shapes `keep` selects on SIMD path `simd`, as
// <prefix>fma_peak/threads:<threads>, <prefix>backward/<shape>/fp32/threads:<threads> and the peak
// again after them, <prefix>fma_peak/after/threads:<threads> (the host can lend a binary less in its
// later minutes than at its start: bench/bench_results.py).
template <class Keep>
void register_group(const std::string& prefix, int threads, PeakIsa isa, Simd simd, Keep keep) {
  const std::string t = "/threads:" + std::to_string(threads);
  register_peak(prefix + "fma_peak" + t, threads, isa);
  for (const Shape& shape : kShapes) {
    if (!keep(shape)) continue;
    const std::string name = prefix + "backward/" + shape.name + "/fp32" + t;
    auto* b = benchmark::RegisterBenchmark(name.c_str(), [shape, threads, simd](benchmark::State& state) {
      Problem& p = problem_of(shape);
      run_once(shape, p, threads, simd);  // warm the thread pool and the pages
      measure(state, [&] {
        run_once(shape, p, threads, simd);
        return flops_of(shape);
      });
    });
    b->UseRealTime()->Unit(benchmark::kMillisecond)->Repetitions(5)->ReportAggregatesOnly(true);
    if (flops_of(shape) > 2e10) b->Iterations(1);  // seconds per call: one call is one sample
  }
  register_peak(prefix + "fma_peak/after" + t, threads, isa);
}

}  // namespace
}  // namespace qkv::bench

int main(int argc, char** argv) {
  using qkv::bench::Shape;
  if (argc > 1 && std::strcmp(argv[1], "--avx2") == 0) {
    if (!qkv::peak_isa_available(qkv::PeakIsa::avx2)) {
      std::fprintf(stderr, "qkv_backward_bench --avx2: this CPU has no AVX2 with FMA\n");
      return 2;
    }
    argv[1] = argv[0];  // Google Benchmark parses the rest
    ++argv, --argc;
    // N >= 1024 without a mask: the shapes the AVX2 path is measured on.
    auto s3_s4 = [](const Shape& s) { return std::strcmp(s.name, "S3") == 0 || std::strcmp(s.name, "S4") == 0; };
    for (int threads : {1, 2}) qkv::bench::register_group("avx2/", threads, qkv::PeakIsa::avx2, qkv::Simd::avx2, s3_s4);
  } else {
    auto with_backward = [](const Shape& s) { return s.N >= 128; };  // S1 (3 tokens) has no backward target
    for (int threads : {1, 2})
      qkv::bench::register_group("", threads, qkv::bench::best_peak_isa(), qkv::Simd::automatic, with_backward);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
