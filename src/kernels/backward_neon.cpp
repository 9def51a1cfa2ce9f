// The fused attention backward with NEON (AArch64 only).
#include "kernels/kernel_deps.h"
#include "kernels/backward_kernel.h"

#include "kernels/simd_neon.h"
#include "kernels/microkernel.h"
#include "kernels/backward_tile.h"

namespace qkv::kernels {

void backward_task_neon(const BackwardParams& p, const BackwardTask& task, float* scratch) {
  backward_task<Neon>(p, task, scratch);
}

}  // namespace qkv::kernels
