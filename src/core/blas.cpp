#include "core/blas.h"

#include <climits>

#include <cblas.h>
#include <fmt/format.h>

#include "qkv/error.h"

namespace qkv::detail {

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t size : {m, n, k, lda, ldb, ldc})
    if (size < 0 || size > INT_MAX) throw Error(fmt::format("matrix product: size {} is outside [0, 2^31 - 1]", size));
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // cblas would do the same, but some builds reject lda = 0; scale by hand.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

}  // namespace qkv::detail
