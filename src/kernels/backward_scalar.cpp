// The fused attention backward for the baseline ISA: the same task algorithm with one-lane vectors.
#include "kernels/kernel_deps.h"
#include "kernels/backward_kernel.h"

#include "kernels/simd_scalar.h"
#include "kernels/microkernel.h"
#include "kernels/backward_tile.h"

namespace qkv::kernels {

void backward_task_scalar(const BackwardParams& p, const BackwardTask& task, float* scratch) {
  backward_task<Scalar>(p, task, scratch);
}

}  // namespace qkv::kernels
