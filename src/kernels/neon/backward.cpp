// The fused attention backward with NEON (AArch64 only).
#include "kernels/neon/ops.h"
#include "kernels/backward.h"
#include "kernels/backward_tile.h"

namespace qkv::kernels {

void backward_tile_neon(const BackwardParams& p, const BackwardTask& task, float* scratch) {
  backward_tile<Neon>(p, task, scratch);
}

}  // namespace qkv::kernels
