// The fused forward kernel compiled for AVX2 + FMA (fused_forward.cpp runs it only when
// resolve_simd in dispatch.cpp chose it, i.e. on CPUs with both).
#include "kernels/kernel_deps.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2")

#include "kernels/simd_avx2.h"
#include "kernels/microkernel.h"
#include "kernels/tile_forward.h"
#include "kernels/tile_group.h"

namespace qkv::kernels {

void forward_tile_avx2(const ForwardParams& p, const TileTask& task, Workspace& ws) { forward_tile<Avx2>(p, task, ws); }

void exp2_avx2(const float* x, float* y, int64_t n) { exp2_array<Avx2>(x, y, n); }

}  // namespace qkv::kernels

#pragma GCC pop_options
