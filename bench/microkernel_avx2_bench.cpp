// The AVX2 micro-kernel of the fused kernels in isolation (microkernel_block.h), compiled for AVX2
// + FMA only, as src/kernels/avx2/ are: 16 ymm registers, no EVEX. Registered by
// `qkv_bench --avx2` (attention_bench.cpp) as avx2/microkernel/...; per CPU second.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

// Before the region (isa_region.h): library code stays compiled for the baseline ISA.
#include "isa_region.h"
#include "kernels/kernel_deps.h"
#include "qkv/tensor.h"

QKV_ISA_REGION_BEGIN("avx2,fma,bmi,bmi2")

#include "kernels/avx2/ops.h"
#include "kernels/microkernel.h"
#include "kernels/softmax_columns.h"
#include "microkernel_block.h"

namespace qkv::bench {
namespace {

void register_avx2_blocks() { register_blocks<kernels::Avx2>("avx2/microkernel/"); }

}  // namespace
}  // namespace qkv::bench

QKV_ISA_REGION_END

namespace qkv::bench {

// Outside the region: qkv_bench --avx2 checks the CPU first.
void register_microkernels_avx2() { register_avx2_blocks(); }

}  // namespace qkv::bench
