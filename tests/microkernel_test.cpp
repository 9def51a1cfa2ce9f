// The micro-kernel's column max (GemmArgs::col_max), which the forward's softmax takes as each
// query's block max instead of a pass over the scores: on every family this CPU runs, for tiles
// with row and vector tails, K in one pass and in chunks (both ways on every CPU: GemmArgs::split_k),
// and NaN rows, col_max must be the exact max of what C holds after the product, with NaN dropped,
// and no column past C's touched, and C must not depend on the chunks. A wrong max would move the
// forward's bits but not its results (its scores stay under the large-score bound), so the
// attention tests alone could not see one.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "attention_cases.h"
#include "kernels/dispatch.h"
#include "test_util.h"

namespace qkv::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(MicroKernel, ColumnMaxIsTheMaxOfWhatItStores) {
  Rng rng("MicroKernel.ColumnMax");
  std::normal_distribution<float> normal;
  for (Simd simd : available_paths()) {
    const kernels::GemmMaxFn gemm = kernels::kernel_family(simd).gemm_max;
    int cases = 0;
    // Rows and columns past each family's tile (6 or 4 rows; 1-4 vectors of 1-16 lanes), K in one
    // pass and, where split, in chunks (AVX-512 splits K = 128 over one panel).
    for (int64_t rows : {1, 3, 4, 5, 6, 7, 13, 64, 128})
      for (int64_t cols : {16, 32, 48, 64, 80, 96})
        for (int64_t kdim : {1, 3, 40, 59, 64, 128}) {
          const int64_t ldc = cols + 5, ldb = cols + 3;
          std::vector<float> a(rows * kdim), b(kdim * ldb), c(rows * ldc, 0.0f);
          for (float& x : a) x = normal(rng.engine());
          for (float& x : b) x = normal(rng.engine());
          // A NaN in a row of A makes that row of C NaN: the max drops it (every row, if rows is 1).
          if (cases % 3 == 0) a[rng.uniform_int(0, rows - 1) * kdim + rng.uniform_int(0, kdim - 1)] = std::nanf("");
          // The max starts from what col_max held: -inf, or a number some columns keep.
          std::vector<float> col_max(cols + 16);
          for (float& x : col_max) x = rng.uniform(0, 1) < 0.5 ? -kInf : normal(rng.engine()) * 4.0f;
          const std::vector<float> before = col_max;
          // K split into chunks where k_chunk says, and in one pass: the same bits (a later chunk
          // carries on from C as the last one stored it), whichever this CPU takes.
          std::vector<float> one_pass = c, one_pass_max = col_max;
          gemm(a.data(), kdim, b.data(), ldb, c.data(), ldc, col_max.data(), rows, cols, true);
          gemm(a.data(), kdim, b.data(), ldb, one_pass.data(), ldc, one_pass_max.data(), rows, cols, false);
          for (int64_t i = 0; i < rows * ldc; ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(c[i]), std::bit_cast<uint32_t>(one_pass[i]))
                << simd_path_name(simd) << ": rows " << rows << ", columns " << cols << ", K " << kdim
                << ": C in chunks and in one pass differ at " << i;
          for (int64_t col = 0; col < cols; ++col) {
            float want = before[col];
            for (int64_t r = 0; r < rows; ++r)
              if (!std::isnan(c[r * ldc + col])) want = std::max(want, c[r * ldc + col]);
            for (const float got : {col_max[col], one_pass_max[col]})
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                  << simd_path_name(simd) << ": rows " << rows << ", columns " << cols << ", K " << kdim << ", column "
                  << col << ": " << got << " against " << want;
          }
          for (int64_t col = cols; col < cols + 16; ++col)
            for (const std::vector<float>* m : {&col_max, &one_pass_max})
              ASSERT_EQ(std::bit_cast<uint32_t>((*m)[col]), std::bit_cast<uint32_t>(before[col]))
                  << simd_path_name(simd) << ": column " << col << " past C was written";
          ++cases;
        }
    EXPECT_GT(cases, 100) << simd_path_name(simd);
    std::printf("column max %s: %d products\n", simd_path_name(simd), cases);
  }
}

}  // namespace
}  // namespace qkv::test
