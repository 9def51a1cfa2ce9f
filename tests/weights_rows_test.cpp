// attention_weights_rows / attention_weights_topk against the float64 reference's full weights.
#include "qkv/weights.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "attention_cases.h"
#include "qkv/reference.h"
#include "test_util.h"

namespace qkv {
namespace {

Tensor<double> reference_weights(const test::Problem& p) {
  const AttentionShape& s = p.shape;
  Tensor<double> q = to_contiguous<double>(TensorView<const float>(p.q.view));
  Tensor<double> k = to_contiguous<double>(TensorView<const float>(p.k.view));
  Tensor<double> v = to_contiguous<double>(TensorView<const float>(p.v.view));
  Tensor<double> out({s.B, s.H, s.N, s.Dv}), w({s.B, s.H, s.N, s.M});
  reference_attention_forward(out.view(), {}, w.view(), q.cview(), k.cview(), v.cview(), p.options);
  return w;
}

std::vector<int64_t> random_rows(test::Rng& rng, int64_t N) {
  std::vector<int64_t> rows;
  const int64_t R = rng.uniform_int(1, 5);
  for (int64_t r = 0; r < R; ++r) rows.push_back(rng.uniform_int(0, N - 1));
  return rows;
}

// With lse from the fused forward (fp32) and with lse recomputed (float64).
TEST(WeightsRows, MatchTheReferenceWeights) {
  test::Rng rng("WeightsRows.Match");
  for (int trial = 0; trial < 120; ++trial) {
    test::Problem p = test::random_problem(rng, 1e6);
    const AttentionShape& s = p.shape;
    if (s.N == 0) continue;
    const Tensor<double> want = reference_weights(p);
    test::run_fused(p, Simd::automatic, 2);
    const std::vector<int64_t> rows = random_rows(rng, s.N);
    const int64_t R = static_cast<int64_t>(rows.size());
    const double score_error = 4 * 5.96e-8 * test::score_bound(p);
    for (bool given_lse : {true, false}) {
      Tensor<float> w({s.B, s.H, R, s.M});
      attention_weights_rows(w.view(), TensorView<const float>(p.q.view), TensorView<const float>(p.k.view),
                             given_lse ? p.lse.cview() : TensorView<const float>(), rows, p.options);
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t r = 0; r < R; ++r) {
            const double lse = p.lse.view()(b, h, rows[r]);
            // The fused forward's fp32 lse is off by the rounding of its fp32 scores, up to about
            // 4·eps·(a bound of |score|) absolutely (as in property_test), and every weight
            // exp(s - lse) inherits that relatively; float64 lse almost none. (4e-6·(1 + |lse|)
            // alone failed on QKV_TEST_SEED=1881185729: |lse| 0.006 from scores of size ~200.)
            const double tol = given_lse && std::isfinite(lse) ? 4e-6 * (1 + std::abs(lse)) + score_error : 1e-6;
            for (int64_t j = 0; j < s.M; ++j) {
              const double ref = want.view()(b, h, rows[r], j);
              ASSERT_NEAR(w.view()(b, h, r, j), ref, tol * std::max(ref, 1e-30) + 1e-7)
                  << "trial " << trial << " row " << rows[r] << " key " << j << " lse "
                  << (given_lse ? "given" : "recomputed") << ": " << p.describe;
            }
          }
    }
  }
}

TEST(WeightsRows, TopKIsTheLargestWeightsInOrder) {
  test::Rng rng("WeightsRows.TopK");
  for (int trial = 0; trial < 60; ++trial) {
    test::Problem p = test::random_problem(rng, 1e6);
    const AttentionShape& s = p.shape;
    if (s.N == 0) continue;
    const Tensor<double> want = reference_weights(p);
    const std::vector<int64_t> rows = random_rows(rng, s.N);
    const int64_t R = static_cast<int64_t>(rows.size()), topk = rng.uniform_int(1, 8);
    Tensor<float> values({s.B, s.H, R, topk});
    Tensor<int64_t> indices({s.B, s.H, R, topk});
    attention_weights_topk(values.view(), indices.view(), TensorView<const float>(p.q.view),
                           TensorView<const float>(p.k.view), {}, rows, topk, p.options);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t r = 0; r < R; ++r) {
          std::vector<double> sorted;
          for (int64_t j = 0; j < s.M; ++j) sorted.push_back(want.view()(b, h, rows[r], j));
          std::sort(sorted.rbegin(), sorted.rend());
          for (int64_t t = 0; t < topk; ++t) {
            const int64_t j = indices.view()(b, h, r, t);
            const float value = values.view()(b, h, r, t);
            if (j < 0) {  // fewer allowed keys than topk: the reference has no more positive weights
              EXPECT_EQ(value, 0.0f);
              if (t < s.M) {
                EXPECT_EQ(sorted[t], 0.0) << p.describe;
              }
              continue;
            }
            ASSERT_LT(j, s.M);
            EXPECT_NEAR(value, sorted[t], 1e-6 * sorted[t] + 1e-30) << "trial " << trial << ": " << p.describe;
            EXPECT_NEAR(value, want.view()(b, h, rows[r], j), 1e-6 * sorted[t] + 1e-30) << p.describe;
            if (t > 0) {
              EXPECT_LE(value, values.view()(b, h, r, t - 1));
            }
          }
        }
  }
}

TEST(WeightsRows, RejectsBadArguments) {
  Tensor<float> q({1, 2, 5, 4}), k({1, 2, 7, 4}), w({1, 2, 2, 7}), lse({1, 2, 4});
  const std::vector<int64_t> rows{0, 5};
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { attention_weights_rows(w.view(), q.cview(), k.cview(), {}, rows); }),
            "rows[1] = 5 is outside [0, 5)");
  const std::vector<int64_t> ok_rows{0, 4};
  EXPECT_EQ(message([&] { attention_weights_rows(w.view(), q.cview(), k.cview(), lse.cview(), ok_rows); }),
            "lse: shape [1, 2, 4] must be [1, 2, 5]");
  Tensor<float> wrong({1, 2, 3, 7});
  EXPECT_EQ(message([&] { attention_weights_rows(wrong.view(), q.cview(), k.cview(), {}, ok_rows); }),
            "weights: shape [1, 2, 3, 7] must be [1, 2, 2, 7]");
  Tensor<float> values({1, 2, 2, 1});
  Tensor<int64_t> indices({1, 2, 2, 1});
  EXPECT_EQ(
      message([&] { attention_weights_topk(values.view(), indices.view(), q.cview(), k.cview(), {}, ok_rows, 0); }),
      "attention_weights_topk: top_k must be at least 1, got 0");
}

// A forward gives no row a NaN or +inf lse from finite q and k: a chosen row's is refused by the
// backward's rule, naming it; a row not chosen is not read, and a NaN in q is the caller's own.
TEST(WeightsRows, RefusesANanOrInfLseOfAChosenRow) {
  test::Rng rng("WeightsRows.RefusesANanOrInfLseOfAChosenRow");
  Tensor<float> q = rng.normal32({1, 2, 5, 4}), k = rng.normal32({1, 2, 7, 4});
  Tensor<float> w({1, 2, 2, 7}), values({1, 2, 2, 3});
  Tensor<int64_t> indices({1, 2, 2, 3});
  const std::vector<int64_t> chosen{0, 3}, others{4, 0};
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Tensor<float> lse({1, 2, 5});
    std::fill(lse.data(), lse.data() + lse.numel(), 3.0f);
    lse.view()(0, 1, 3) = bad;
    const std::string want = fmt::format(
        "attention_weights: the lse of query row 3 (batch 0, head 1) is {} although q and k are finite; no forward "
        "gives that (a row's lse is finite, or -inf when the row has no allowed key): pass the lse the forward "
        "returned for these q, k, mask and scale, or no lse to recompute it",
        std::isnan(bad) ? "NaN" : "+inf");
    test::expect_error([&] { attention_weights_rows(w.view(), q.cview(), k.cview(), lse.cview(), chosen); }, {want});
    test::expect_error(
        [&] { attention_weights_topk(values.view(), indices.view(), q.cview(), k.cview(), lse.cview(), chosen, 3); },
        {want});
    attention_weights_rows(w.view(), q.cview(), k.cview(), lse.cview(), others);
    attention_weights_topk(values.view(), indices.view(), q.cview(), k.cview(), lse.cview(), others, 3);
    for (int64_t j = 0; j < 7; ++j) EXPECT_TRUE(std::isfinite(w.view()(0, 1, 0, j))) << j;
    // A NaN in q is the caller's own: the row's weights are NaN, as the composite's are.
    const float kept = q.view()(0, 1, 3, 2);
    q.view()(0, 1, 3, 2) = std::numeric_limits<float>::quiet_NaN();
    attention_weights_rows(w.view(), q.cview(), k.cview(), lse.cview(), chosen);
    for (int64_t j = 0; j < 7; ++j) EXPECT_TRUE(std::isnan(w.view()(0, 1, 1, j))) << j;
    q.view()(0, 1, 3, 2) = kept;
  }
}

}  // namespace
}  // namespace qkv
