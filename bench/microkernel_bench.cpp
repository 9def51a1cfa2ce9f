// The AVX-512 micro-kernel of the fused kernels in isolation, on cache-resident blocks shaped as
// in the forward pass (64 query lanes, key blocks of 64; microkernel_block.h). Registered by
// attention_bench.cpp. Rates are per CPU second of the benchmark thread (Google Benchmark's
// default), so a loaded machine does not lower them.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

// Before the region (isa_region.h): library code stays compiled for the baseline ISA.
#include "isa_region.h"
#include "kernels/kernel_deps.h"
#include "qkv/tensor.h"

QKV_ISA_REGION_BEGIN("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")

#include "kernels/avx512/ops.h"
#include "kernels/microkernel.h"
#include "kernels/softmax_columns.h"
#include "microkernel_block.h"

namespace qkv::bench {
namespace {

void register_avx512_blocks() { register_blocks<kernels::Avx512>("microkernel/"); }

}  // namespace
}  // namespace qkv::bench

QKV_ISA_REGION_END

namespace qkv::bench {

// Outside the region: it runs before the CPU check.
void register_microkernels() {
  if (!__builtin_cpu_supports("avx512f")) return;
  register_avx512_blocks();
}

}  // namespace qkv::bench
