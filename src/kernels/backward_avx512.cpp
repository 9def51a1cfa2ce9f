// The fused attention backward compiled for AVX-512 (F, BW, DQ, VL). The library itself is built
// for the baseline ISA; attention/backward.cpp calls in here only on CPUs that have these features
// (no avx512bf16: the backward has no bf16 path, and must not run only where the CPU has one).
#include "kernels/kernel_deps.h"
#include "kernels/backward_kernel.h"

#pragma GCC push_options
// GCC 12 flags the deliberately undefined pass-through operand of _mm512_max_ps, the shuffles
// and friends.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2")

#include "kernels/simd_avx512.h"
#include "kernels/microkernel.h"
#include "kernels/backward_tile.h"

namespace qkv::kernels {

void backward_task_avx512(const BackwardParams& p, const BackwardTask& task, float* scratch) {
  backward_task<Avx512>(p, task, scratch);
}

}  // namespace qkv::kernels

#pragma GCC diagnostic pop
#pragma GCC pop_options
