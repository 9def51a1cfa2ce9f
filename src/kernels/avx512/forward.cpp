// The fused forward kernel compiled for AVX-512 (F, BW, DQ, VL; BF16 and AMX for the bf16 inputs).
// forward.cpp runs this family only when resolve_simd (dispatch.cpp) chose it, i.e. on CPUs that
// have these features.
#include "kernels/avx512/ops.h"
#include "kernels/forward.h"
#include "kernels/tile_group.h"

namespace qkv::kernels {

void forward_tile_avx512(const ForwardParams& p, const ForwardTask& task, Workspace& ws) {
  if (p.bf16_dot)
    forward_tile<Avx512, true>(p, task, ws);
  else
    forward_tile<Avx512, false>(p, task, ws);
}

void exp2_avx512(const float* x, float* y, int64_t n) { exp2_array<Avx512>(x, y, n); }

void gemm_max_avx512(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
                     int64_t rows, int64_t cols, bool split_k) {
  gemm_max<Avx512>(a, kdim, b, ldb, c, ldc, col_max, rows, cols, split_k);
}

}  // namespace qkv::kernels
