// The micro-kernel (src/kernels/microkernel.h) of each SIMD family, as plain functions the tests
// call from baseline code: each family's file compiles it for its instruction set, and a test
// calls one only where the CPU runs it (microkernel_test.cpp).
#pragma once

#include <cstdint>

namespace qkv::test {

// gemm_blocked of one family: C [rows x vecs·L] = A [rows x kdim] · B [kdim x vecs·L], A's rows
// kdim floats apart, B's ldb, C's ldc; with col_max non-null, col_max[c] = max(col_max[c], C's
// column c) as GemmArgs::col_max says.
using GemmFn = void (*)(const float* a, int64_t kdim, const float* b, int64_t ldb, float* c, int64_t ldc,
                        float* col_max, int64_t rows, int64_t vecs);

struct Family {
  const char* name;
  int lanes, tile_rows, tile_vecs;  // Ops::kLanes, kRows, kVecs
  GemmFn gemm;
};

Family scalar_family();
#if defined(__x86_64__)
Family avx2_family();
Family avx512_family();
#endif

}  // namespace qkv::test
