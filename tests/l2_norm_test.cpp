// large_scores.h's norms decide which scores are summed again in double, and the forward (from Qᵀ
// and rows of k) and the backward (from rows of q and k) must decide alike: every form of the norm
// gives the bits of one order, written out here: four partial sums in double, element d into sum
// d mod 4, added as (s0 + s1) + (s2 + s3), its square root rounded to float once.
#include "kernels/scalar/ops.h"
// (ops.h first: large_scores.h takes the family's definitions from it.)
#include "kernels/large_scores.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qkv::kernels {
namespace {

float norm_in_order(const std::vector<float>& x) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  for (std::size_t d = 0; d < x.size(); ++d) s[d % 4] += static_cast<double>(x[d]) * x[d];
  return static_cast<float>(std::sqrt((s[0] + s[1]) + (s[2] + s[3])));
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(L2Norm, EveryFormGivesTheBitsOfOneOrder) {
  test::Rng rng("L2Norm.EveryFormGivesTheBitsOfOneOrder");
  for (const int64_t n : {1, 3, 4, 5, 40, 59, 64, 111, 128})
    for (const int64_t rows : {1, 3, 8, 17}) {
      // rows x n, scaled per row over 60 binades so that the partial sums round differently
      std::vector<std::vector<float>> x(rows, std::vector<float>(n));
      for (auto& row : x) {
        const float scale = std::ldexp(1.0f, static_cast<int>(rng.uniform_int(-30, 30)));
        for (float& e : row) e = static_cast<float>(rng.uniform(-1.0, 1.0)) * scale;
      }
      const int64_t ld = (rows + 7) / 8 * 8 + 3;  // Qᵀ's rows, readable past `rows`
      std::vector<float> xt(static_cast<std::size_t>(n * ld), 0.0f), strided(static_cast<std::size_t>(2 * n));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < n; ++d) xt[d * ld + r] = x[r][d];
      std::vector<float> columns(static_cast<std::size_t>(rows));
      column_l2_norms(xt.data(), ld, rows, n, columns.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float want = norm_in_order(x[r]);
        for (int64_t d = 0; d < n; ++d) strided[2 * d] = x[r][d];
        std::vector<bf16> halves(x[r].size());
        for (std::size_t d = 0; d < halves.size(); ++d) halves[d] = float_to_bf16(x[r][d]);
        std::vector<float> widened(halves.size());
        for (std::size_t d = 0; d < halves.size(); ++d) widened[d] = widen(halves[d]);
        const std::string at = "n = " + std::to_string(n) + ", row " + std::to_string(r);
        EXPECT_TRUE(same_bits(l2_norm(x[r].data(), 1, n), want)) << "contiguous, " << at;
        EXPECT_TRUE(same_bits(l2_norm(strided.data(), 2, n), want)) << "strided, " << at;
        EXPECT_TRUE(same_bits(columns[r], want)) << "columns of the transpose, " << at;
        EXPECT_TRUE(same_bits(l2_norm(halves.data(), 1, n), norm_in_order(widened))) << "bf16, " << at;
      }
    }
}

}  // namespace
}  // namespace qkv::kernels
