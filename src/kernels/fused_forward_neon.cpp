// The fused forward kernel with NEON (AArch64 only: dispatch.cpp lists it there, where every CPU
// has Advanced SIMD, so it needs no target pragma).
#include "kernels/kernel_deps.h"

#include "kernels/simd_neon.h"
#include "kernels/microkernel.h"
#include "kernels/tile_forward.h"
#include "kernels/tile_group.h"

namespace qkv::kernels {

void forward_tile_neon(const ForwardParams& p, const TileTask& task, Workspace& ws) { forward_tile<Neon>(p, task, ws); }

void exp2_neon(const float* x, float* y, int64_t n) { exp2_array<Neon>(x, y, n); }

}  // namespace qkv::kernels
