// families.h's Family of one SIMD family, compiled for the instruction set of the file that
// includes it (after kernels/kernel_deps.h, the family's ops.h and kernels/microkernel.h).
#pragma once

#include "families.h"

namespace qkv::test {
namespace {

template <class Ops>
void gemm_of(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc, float* col_max,
             int64_t rows, int64_t vecs) {
  kernels::GemmArgs<float, float> g;
  g.kdim = kdim, g.a = a, g.a_row = kdim, g.a_k = 1, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc, g.col_max = col_max;
  kernels::gemm_blocked<Ops>(g, rows, vecs);
}

template <class Ops>
Family family_of(const char* name) {
  return {name, Ops::kLanes, Ops::kRows, Ops::kVecs, &gemm_of<Ops>};
}

}  // namespace
}  // namespace qkv::test
