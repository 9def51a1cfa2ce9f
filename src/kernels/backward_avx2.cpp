// The fused attention backward compiled for AVX2 + FMA (called only on CPUs with both).
#include "kernels/kernel_deps.h"
#include "kernels/backward_kernel.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2")

#include "kernels/simd_avx2.h"
#include "kernels/microkernel.h"
#include "kernels/backward_tile.h"

namespace qkv::kernels {

void backward_task_avx2(const BackwardParams& p, const BackwardTask& task, float* scratch) {
  backward_task<Avx2>(p, task, scratch);
}

}  // namespace qkv::kernels

#pragma GCC pop_options
