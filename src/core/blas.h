// Row-major single-precision matrix products through OpenBLAS, with the size checks cblas cannot
// do itself (its dimensions are 32-bit). Internal to the library.
#pragma once

#include <cstdint>

namespace qkv::detail {

// c[m, n] = alpha · op(a) · op(b) + beta · c, all row-major with leading dimensions lda, ldb, ldc;
// op(a) is [m, k] (a stored [k, m] when trans_a), op(b) is [k, n] (b stored [n, k] when trans_b).
// Empty products (m, n or k = 0) only scale c by beta. Throws qkv::Error if a size exceeds 2^31 - 1
// or OpenBLAS cannot be loaded.
//
// C is computed in a grid of blocks fixed by (m, n, k) alone, each block one OpenBLAS call on one
// thread, the blocks shared by up to `threads` threads (0 = default_num_threads()). OpenBLAS's
// own threading splits a product by its thread count, and the bits changed with it (a layer's
// forward and backward on B·N = 768 rows of E = 100 differed between OPENBLAS_NUM_THREADS 1 and
// 2); here they depend on the shape only, never on `threads`, OPENBLAS_NUM_THREADS or
// OMP_NUM_THREADS.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads);

// The same product without OpenBLAS, on the calling thread, for an address space too small for
// OpenBLAS's buffers (under kAddressSpaceReserve, qkv/address_space.h), where sgemm calls it. Its
// inner loop runs along rows of C with unit strides, which the compiler vectorizes; a plain triple
// loop had made training there 18x slower than with OpenBLAS. Throws std::bad_alloc when its
// scratch (about max(k, 2^20) floats) cannot be allocated.
void sgemm_without_blas(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                        int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace qkv::detail
