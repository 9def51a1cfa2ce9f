// The fused forward kernel compiled for AVX2 + FMA (forward.cpp runs it only when resolve_simd in
// dispatch.cpp chose it, i.e. on CPUs with both).
#include "kernels/avx2/ops.h"
#include "kernels/forward.h"
#include "kernels/tile_group.h"

namespace qkv::kernels {

void forward_tile_avx2(const ForwardParams& p, const ForwardTask& task, Workspace& ws) {
  forward_tile<Avx2>(p, task, ws);
}

void exp2_avx2(const float* x, float* y, int64_t n) { exp2_array<Avx2>(x, y, n); }

void gemm_max_avx2(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
                   int64_t rows, int64_t cols, bool split_k) {
  gemm_max<Avx2>(a, kdim, b, ldb, c, ldc, col_max, rows, cols, split_k);
}

}  // namespace qkv::kernels
