// The fused forward kernel with NEON (AArch64 only).
#include "kernels/neon/ops.h"
#include "kernels/forward.h"
#include "kernels/tile_group.h"

namespace qkv::kernels {

void forward_tile_neon(const ForwardParams& p, const ForwardTask& task, Workspace& ws) {
  forward_tile<Neon>(p, task, ws);
}

void exp2_neon(const float* x, float* y, int64_t n) { exp2_array<Neon>(x, y, n); }

void gemm_max_neon(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
                   int64_t rows, int64_t cols, bool split_k) {
  gemm_max<Neon>(a, kdim, b, ldb, c, ldc, col_max, rows, cols, split_k);
}

}  // namespace qkv::kernels
