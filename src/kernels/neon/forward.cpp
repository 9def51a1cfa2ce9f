// The fused forward kernel with NEON (AArch64 only).
#include "kernels/neon/ops.h"
#include "kernels/forward.h"
#include "kernels/tile_group.h"

namespace qkv::kernels {

void forward_tile_neon(const ForwardParams& p, const ForwardTask& task, Workspace& ws) {
  forward_tile<Neon>(p, task, ws);
}

void exp2_neon(const float* x, float* y, int64_t n) { exp2_array<Neon>(x, y, n); }

}  // namespace qkv::kernels
