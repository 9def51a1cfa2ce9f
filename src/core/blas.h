// Row-major single-precision matrix products through OpenBLAS, with the size checks cblas cannot
// do itself (its dimensions are 32-bit). Internal to the library.
#pragma once

#include <cstdint>

namespace qkv::detail {

// c[m, n] = alpha · op(a) · op(b) + beta · c, all row-major with leading dimensions lda, ldb, ldc;
// op(a) is [m, k] (a stored [k, m] when trans_a), op(b) is [k, n] (b stored [n, k] when trans_b).
// Empty products (m, n or k = 0) only scale c by beta. Throws qkv::Error if a size exceeds 2^31 - 1.
// OpenBLAS's process-wide thread count (loading OpenBLAS on first use; see blas.cpp). The setter
// caps `n` to the workers the address space holds. Throws qkv::Error if OpenBLAS cannot be loaded.
int blas_num_threads();
void set_blas_num_threads(int n);

// OpenBLAS's thread count is process-wide: sets it to n (if n > 0) for a scope and restores the
// previous count at the end.
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(int n) : saved_(blas_num_threads()) {
    if (n > 0) set_blas_num_threads(n);
  }
  ~ScopedBlasThreads() { set_blas_num_threads(saved_); }
  ScopedBlasThreads(const ScopedBlasThreads&) = delete;
  ScopedBlasThreads& operator=(const ScopedBlasThreads&) = delete;

 private:
  int saved_;
};

// OpenBLAS on one thread for a scope. Its products' bits change with its thread count (a layer's
// forward and backward on B·N = 768 rows of E = 100 differ between 1 and 2 threads), so work
// whose result must not depend on the thread count asked for (training) holds it at one.
class OneBlasThread : public ScopedBlasThreads {
 public:
  OneBlasThread() : ScopedBlasThreads(1) {}
};

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace qkv::detail
