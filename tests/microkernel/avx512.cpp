// families.h's AVX-512 micro-kernel. Only the function below is compiled for AVX-512; the test
// calls it after checking the CPU.
#if defined(__x86_64__)
#include "families.h"

#include "kernels/kernel_deps.h"

#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")
#include "kernels/avx512/ops.h"
#include "kernels/microkernel.h"

namespace qkv::test {
namespace {

void gemm(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
          int64_t rows, int64_t vecs) {
  kernels::GemmArgs<float, float> g;
  g.kdim = kdim, g.a = a, g.a_row = kdim, g.a_k = 1, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc, g.col_max = col_max;
  kernels::gemm_blocked<kernels::Avx512>(g, rows, vecs);
}

}  // namespace
}  // namespace qkv::test
#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace qkv::test {
using kernels::Avx512;
Family avx512_family() { return {"avx512", Avx512::kLanes, Avx512::kRows, Avx512::kVecs, &gemm}; }
}  // namespace qkv::test
#endif
