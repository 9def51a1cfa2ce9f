// Google Benchmark of the fused attention backward on the forward's shapes S2-S6 (fp32), with 1
// and 2 threads, each thread group preceded by the FMA peak measured the same way. FLOPs are the
// issue's convention: 10·B·H·N·M·D (the five block products), half of it under a causal mask.
// Besides FLOPS (per wall-clock second), CPU_FLOPS counts per CPU-second of the whole process (all
// threads): on a shared machine wall time measures the load, CPU time the kernel.
#include <benchmark/benchmark.h>

#include <time.h>

#include <array>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fma_peak.h"
#include "shapes.h"
#include "qkv/backward.h"

namespace qkv::bench {
namespace {

// The backward's FLOPs: 10·B·H·N²·D (five block products; half under a causal mask).
double flops_of(const Shape& s) { return flops_of(s, 10.0); }

AttentionOptions options_of(const Shape& s, int threads) {
  AttentionOptions options;
  options.num_threads = threads;
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
  std::mt19937 rng(42);
  std::normal_distribution<float> dist;
  for (auto* t : {&p.q, &p.k, &p.v, &p.dout}) {
    t->resize(n);
    for (float& x : *t) x = dist(rng);
  }
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

void run_once(const Shape& s, Problem& p, int threads) {
  const std::array<int64_t, 3> lse_shape{s.B, s.H, s.N};
  auto in = [&](std::vector<float>& t) { return TensorView<const float>(t.data(), p.shape); };
  auto grad = [&](std::vector<float>& t) { return TensorView<float>(t.data(), p.shape); };
  attention_backward(grad(p.dq), grad(p.dk), grad(p.dv), {}, in(p.dout), in(p.q), in(p.k), in(p.v), in(p.out),
                     TensorView<const float>(p.lse.data(), lse_shape), options_of(s, threads));
}

void register_group(int threads) {
  benchmark::RegisterBenchmark(
      ("fma_peak/threads:" + std::to_string(threads)).c_str(),
      [threads](benchmark::State& state) { measure(state, [threads] { return fma_peak_work(threads, 20'000'000); }); })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->Repetitions(5)
      ->ReportAggregatesOnly(true);
  for (const Shape& shape : kShapes) {
    if (shape.N < 128) continue;  // S1 (3 tokens) has no backward target
    const std::string name = std::string("backward/") + shape.name + "/fp32/threads:" + std::to_string(threads);
    auto* b = benchmark::RegisterBenchmark(name.c_str(), [shape, threads](benchmark::State& state) {
      Problem& p = problem_of(shape);
      run_once(shape, p, threads);  // warm the thread pool and the pages
      measure(state, [&] {
        run_once(shape, p, threads);
        return flops_of(shape);
      });
    });
    b->UseRealTime()->Unit(benchmark::kMillisecond)->Repetitions(5)->ReportAggregatesOnly(true);
    if (flops_of(shape) > 2e10) b->Iterations(1);  // seconds per call: one call is one sample
  }
}

}  // namespace
}  // namespace qkv::bench

int main(int argc, char** argv) {
  qkv::bench::register_group(1);
  qkv::bench::register_group(2);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
