// The micro-kernel's column max (GemmArgs::col_max), which the forward's softmax takes as each
// query's block max instead of a pass over the scores: on every family this CPU runs, for tiles
// with row and vector tails, K in one pass and in chunks, and NaN rows, col_max must be the exact
// max of what C holds after the product, with NaN dropped, and no column past C's touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "microkernel/families.h"
#include "test_util.h"

#include "kernels/kernel_deps.h"
#include "kernels/scalar/ops.h"
#include "kernels/microkernel.h"

#include "microkernel/gemm_of.h"  // after the micro-kernel, which it calls

namespace qkv::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

void check_col_max(const Family& f, Rng& rng) {
  std::normal_distribution<float> normal;
  const int R = f.tile_rows, NV = f.tile_vecs;
  int cases = 0;
  for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{R}, int64_t{R + 1}, int64_t{64}, int64_t{128}})
    for (int64_t vecs : {int64_t{1}, int64_t{NV - 1}, int64_t{NV}, int64_t{NV + 1}, int64_t{64 / f.lanes}}) {
      if (vecs < 1) continue;
      for (int64_t kdim : {int64_t{1}, int64_t{3}, int64_t{40}, int64_t{59}, int64_t{64}, int64_t{128}}) {
        const int64_t width = vecs * f.lanes, ldc = width + 5, ldb = width + 3;
        std::vector<float> a(rows * kdim), b(kdim * ldb), c(rows * ldc, 0.0f);
        for (float& x : a) x = normal(rng.engine());
        for (float& x : b) x = normal(rng.engine());
        // A NaN in a row of A makes that row of C NaN: the max must drop it (every row, if rows is 1).
        const int64_t nan_row = rng.uniform_int(0, rows - 1);
        if (cases % 3 == 0) a[nan_row * kdim + rng.uniform_int(0, kdim - 1)] = std::nanf("");
        // The max starts from what col_max held: -inf, or a number some columns keep.
        std::vector<float> col_max(width + f.lanes);
        for (float& x : col_max) x = rng.uniform(0, 1) < 0.5 ? -kInf : normal(rng.engine()) * 4.0f;
        const std::vector<float> before = col_max;
        f.gemm(a.data(), kdim, b.data(), ldb, c.data(), ldc, col_max.data(), rows, vecs);
        for (int64_t col = 0; col < width; ++col) {
          float want = before[col];
          for (int64_t r = 0; r < rows; ++r)
            if (!std::isnan(c[r * ldc + col])) want = std::max(want, c[r * ldc + col]);
          ASSERT_EQ(std::bit_cast<uint32_t>(col_max[col]), std::bit_cast<uint32_t>(want))
              << f.name << ": rows " << rows << ", vecs " << vecs << ", K " << kdim << ", column " << col << ": "
              << col_max[col] << " against " << want;
        }
        for (int64_t col = width; col < width + f.lanes; ++col)
          ASSERT_EQ(std::bit_cast<uint32_t>(col_max[col]), std::bit_cast<uint32_t>(before[col]))
              << f.name << ": column " << col << " past C was written";
        ++cases;
      }
    }
  EXPECT_GT(cases, 100);
}

}  // namespace

Family scalar_family() { return family_of<kernels::Scalar>("scalar"); }

TEST(MicroKernel, ColumnMaxScalar) {
  Rng rng("MicroKernel.ColumnMaxScalar");
  check_col_max(scalar_family(), rng);
}

#if defined(__x86_64__)
TEST(MicroKernel, ColumnMaxAvx2) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) GTEST_SKIP() << "this CPU has no AVX2 and FMA";
  Rng rng("MicroKernel.ColumnMaxAvx2");
  check_col_max(avx2_family(), rng);
}

TEST(MicroKernel, ColumnMaxAvx512) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "this CPU has no AVX-512";
  Rng rng("MicroKernel.ColumnMaxAvx512");
  check_col_max(avx512_family(), rng);
}
#endif

}  // namespace qkv::test
