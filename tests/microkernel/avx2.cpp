// families.h's AVX2 micro-kernel. Only the function below is compiled for AVX2; the test
// calls it after checking the CPU.
#if defined(__x86_64__)
#include "families.h"

#include "kernels/kernel_deps.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2")
#include "kernels/avx2/ops.h"
#include "kernels/microkernel.h"

namespace qkv::test {
namespace {

void gemm(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
          int64_t rows, int64_t vecs) {
  kernels::GemmArgs<float, float> g;
  g.kdim = kdim, g.a = a, g.a_row = kdim, g.a_k = 1, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc, g.col_max = col_max;
  kernels::gemm_blocked<kernels::Avx2>(g, rows, vecs);
}

}  // namespace
}  // namespace qkv::test
#pragma GCC pop_options

namespace qkv::test {
using kernels::Avx2;
Family avx2_family() { return {"avx2", Avx2::kLanes, Avx2::kRows, Avx2::kVecs, &gemm}; }
}  // namespace qkv::test
#endif
