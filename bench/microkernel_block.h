// One cache-resident block product of the fused kernels for the micro-kernel benchmarks
// (microkernel_bench.cpp: AVX-512, microkernel_avx2_bench.cpp: AVX2): what a family's block
// products reach without the softmax, packing and memory traffic around them. Include only after
// kernel_deps.h, a family's target pragma, its simd_*.h and microkernel.h.
#pragma once

#include <benchmark/benchmark.h>

#include <vector>

namespace qkv::bench {
namespace {

// scores: Sᵀ [64 keys x 64 lanes] = K [64 x D] · Qᵀ [D x 64]; values: O [64 x 64] = alpha ⊙ O + P · V.
template <class Ops>
void run_block(benchmark::State& state, bool scores, int64_t d) {
  std::vector<float> a(64 * 256, 0.01f), b(256 * 64, 0.02f), c(64 * 64, 0.0f), alpha(64, 0.999f);
  kernels::GemmArgs<float, float> g;
  g.kdim = scores ? d : 64;
  g.a = a.data();
  g.a_row = scores ? d : 1;  // rows of K, or P read transposed
  g.a_k = scores ? 1 : 64;
  g.b = b.data();
  g.ldb = 64;
  g.c = c.data();
  g.ldc = 64;
  g.alpha = scores ? nullptr : alpha.data();
  for (auto _ : state) {
    kernels::gemm_blocked<Ops>(g, 64, 64 / Ops::kLanes);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOPS"] =
      benchmark::Counter(2.0 * 64 * 64 * static_cast<double>(g.kdim), benchmark::Counter::kIsIterationInvariantRate);
}

// Registers the family's three block products as <prefix>scores_D64, scores_D128 and values.
template <class Ops>
void register_blocks(const std::string& prefix) {
  for (int64_t d : {64, 128})
    benchmark::RegisterBenchmark((prefix + "scores_D" + std::to_string(d)).c_str(),
                                 [d](benchmark::State& s) { run_block<Ops>(s, true, d); })
        ->Repetitions(5)
        ->ReportAggregatesOnly(true);
  benchmark::RegisterBenchmark((prefix + "values").c_str(), [](benchmark::State& s) { run_block<Ops>(s, false, 64); })
      ->Repetitions(5)
      ->ReportAggregatesOnly(true);
}

}  // namespace
}  // namespace qkv::bench
