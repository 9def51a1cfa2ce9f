// The AVX-512 micro-kernel of the fused kernels in isolation, on cache-resident blocks shaped as
// in the forward pass (64 query lanes, key blocks of 64; microkernel_block.h). Registered by
// attention_bench.cpp. Rates are per CPU second of the benchmark thread (Google Benchmark's
// default), so a loaded machine does not lower them.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

// Before the target pragma: library code (Google Benchmark's too, which this file shares with the
// rest of qkv_bench) stays compiled for the baseline ISA, so no copy of it needs AVX-512 or AVX2.
#include "kernels/kernel_deps.h"

#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")

#include "kernels/avx512/ops.h"
#include "kernels/microkernel.h"
#include "kernels/softmax_columns.h"
#include "microkernel_block.h"

namespace qkv::bench {
namespace {

void register_avx512_blocks() { register_blocks<kernels::Avx512>("microkernel/"); }

}  // namespace
}  // namespace qkv::bench

#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace qkv::bench {

// Outside the target region: it runs before the CPU check.
void register_microkernels() {
  if (!__builtin_cpu_supports("avx512f")) return;
  register_avx512_blocks();
}

}  // namespace qkv::bench
