// Sinusoidal positional encoding (qkv/positions.h) against the paper's formula written out here
// in long double, and its point: without it a permuted sentence gives permuted outputs, with it
// the outputs change.
#include <cmath>

#include <gtest/gtest.h>

#include "qkv/error.h"
#include "qkv/layer.h"
#include "qkv/positions.h"
#include "test_util.h"

namespace qkv {
namespace {

// PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).
long double paper_pe(int64_t pos, int64_t column, int64_t d_model) {
  const int64_t i = column / 2;
  const long double angle = static_cast<long double>(pos) / std::pow(10000.0L, 2.0L * i / d_model);
  return column % 2 == 0 ? std::sin(angle) : std::cos(angle);
}

TEST(Positions, MatchThePapersFormula) {
  for (int64_t E : {1, 3, 4, 50, 59, 111})
    for (int64_t pos = 0; pos < 600; pos += 7)
      for (int64_t c = 0; c < E; ++c)
        ASSERT_NEAR(sinusoidal_position(pos, c, E), static_cast<double>(paper_pe(pos, c, E)), 1e-12)
            << "pos " << pos << " column " << c << " E " << E;
  EXPECT_EQ(sinusoidal_position(0, 0, 8), 0.0);  // sin 0
  EXPECT_EQ(sinusoidal_position(0, 1, 8), 1.0);  // cos 0
}

TEST(Positions, AddedOncePerSentenceRoundedOnce) {
  test::Rng rng("Positions.AddedOncePerSentenceRoundedOnce");
  for (auto [B, N, E] : {std::array<int64_t, 3>{1, 1, 1}, {2, 3, 59}, {3, 17, 50}}) {
    Tensor<float> x = rng.normal32(std::array<int64_t, 3>{B, N, E});
    const Tensor<float> before = x.clone();
    add_sinusoidal_positions(x.view());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t e = 0; e < E; ++e) {
          const double want = static_cast<double>(before.cview()(b, n, e)) + static_cast<double>(paper_pe(n, e, E));
          ASSERT_EQ(x.cview()(b, n, e), static_cast<float>(want))
              << "seed " << rng.seed() << " at " << b << "," << n << "," << e;
        }
    // [N, E]: the same positions as one sentence of the batch.
    Tensor<float> one({N, E});
    for (int64_t i = 0; i < N * E; ++i) one[i] = before[i];
    add_sinusoidal_positions(one.view());
    for (int64_t i = 0; i < N * E; ++i) ASSERT_EQ(one[i], x[i]);
  }
}

TEST(Positions, RefusesOtherRanks) {
  Tensor<float> x({4});
  try {
    add_sinusoidal_positions(x.view());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be [N, E] or [B, N, E], got rank 1"), std::string::npos) << e.what();
  }
}

// The reason for positions: self-attention alone is permutation-equivariant.
TEST(Positions, MakeWordOrderMatter) {
  test::Rng rng("Positions.MakeWordOrderMatter");
  const int64_t N = 5, E = 8;
  MultiHeadAttention layer(LayerConfig{.embed_dim = E, .num_heads = 2, .seed = rng.seed()});
  const Tensor<float> x = rng.normal32({N, E});
  Tensor<float> reversed({N, E});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) reversed.view()(n, e) = x.cview()(N - 1 - n, e);
  const auto max_gap = [&](const Tensor<float>& a, const Tensor<float>& b) {
    double gap = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e) gap = std::max(gap, std::abs(double(a.cview()(n, e)) - b.cview()(N - 1 - n, e)));
    return gap;
  };
  EXPECT_LT(max_gap(layer.forward(x.cview()), layer.forward(reversed.cview())), 1e-5) << "seed " << rng.seed();
  Tensor<float> xp = x.clone(), rp = reversed.clone();
  add_sinusoidal_positions(xp.view());
  add_sinusoidal_positions(rp.view());
  EXPECT_GT(max_gap(layer.forward(xp.cview()), layer.forward(rp.cview())), 1e-2) << "seed " << rng.seed();
}

}  // namespace
}  // namespace qkv
