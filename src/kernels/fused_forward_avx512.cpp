// The fused forward kernel compiled for AVX-512 (F, BW, DQ, VL; BF16 and AMX for the bf16 inputs). The
// library itself is built for the baseline ISA; fused_forward.cpp runs this family only when
// resolve_simd (dispatch.cpp) chose it, i.e. on CPUs that have these features.
#include "kernels/kernel_deps.h"

#pragma GCC push_options
// GCC 12 flags the deliberately undefined pass-through operand of _mm512_max_ps, the shuffles
// and friends.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16,avx2,fma,bmi,bmi2")

#include "kernels/simd_avx512.h"
#include "kernels/microkernel.h"
#include "kernels/tile_forward.h"
#include "kernels/tile_group.h"

namespace qkv::kernels {

void forward_tile_avx512(const ForwardParams& p, const TileTask& task, Workspace& ws) {
  if (p.bf16_dot)
    forward_tile<Avx512, true>(p, task, ws);
  else
    forward_tile<Avx512, false>(p, task, ws);
}

void exp2_avx512(const float* x, float* y, int64_t n) { exp2_array<Avx512>(x, y, n); }

}  // namespace qkv::kernels

#pragma GCC diagnostic pop
#pragma GCC pop_options
