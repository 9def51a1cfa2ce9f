// The AVX-512 micro-kernel of the fused kernels in isolation, on cache-resident blocks shaped as
// in the forward pass (64 query lanes, key blocks of 64): what the block products reach without
// the softmax, packing and memory traffic around them. Registered by attention_bench.cpp. Rates
// are per CPU second of the benchmark thread (Google Benchmark's default), so a loaded machine
// does not lower them.
#include <benchmark/benchmark.h>

#include <vector>

#include "kernels/kernel_deps.h"

#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")

#include "kernels/simd_avx512.h"
#include "kernels/microkernel.h"

namespace qkv::bench {
namespace {

using kernels::Avx512;

// scores: Sᵀ [64 keys x 64 lanes] = K [64 x D] · Qᵀ [D x 64]; values: O [64 x 64] = alpha ⊙ O + P · V.
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
    kernels::gemm_blocked<Avx512>(g, 64, 4);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOPS"] =
      benchmark::Counter(2.0 * 64 * 64 * static_cast<double>(g.kdim), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace
}  // namespace qkv::bench

#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace qkv::bench {

// Outside the target region: it runs before the CPU check.
void register_microkernels() {
  if (!__builtin_cpu_supports("avx512f")) return;
  for (int64_t d : {64, 128})
    benchmark::RegisterBenchmark(("microkernel/scores_D" + std::to_string(d)).c_str(),
                                 [d](benchmark::State& s) { run_block(s, true, d); })
        ->Repetitions(5)
        ->ReportAggregatesOnly(true);
  benchmark::RegisterBenchmark("microkernel/values", [](benchmark::State& s) { run_block(s, false, 64); })
      ->Repetitions(5)
      ->ReportAggregatesOnly(true);
}

}  // namespace qkv::bench
