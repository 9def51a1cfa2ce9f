// The fused forward kernel for the baseline ISA: the same tile algorithm with one-lane vectors.
#include "kernels/scalar/ops.h"
#include "kernels/forward.h"
#include "kernels/tile_group.h"

namespace qkv::kernels {

void forward_tile_scalar(const ForwardParams& p, const ForwardTask& task, Workspace& ws) {
  forward_tile<Scalar>(p, task, ws);
}

void exp2_scalar(const float* x, float* y, int64_t n) { exp2_array<Scalar>(x, y, n); }

void gemm_max_scalar(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
                     int64_t rows, int64_t cols, bool split_k) {
  gemm_max<Scalar>(a, kdim, b, ldb, c, ldc, col_max, rows, cols, split_k);
}

}  // namespace qkv::kernels
