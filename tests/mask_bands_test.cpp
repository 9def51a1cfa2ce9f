// The bands of every structural mask (lengths, causal either way, windows) lie in the order the
// backward relies on to visit only the query tiles that see a key group (detail::bands_ordered);
// anything else falls back to visiting every tile.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/mask_eval.h"
#include "test_util.h"

namespace qkv {
namespace {

std::vector<detail::KeyBand> bands_of(const Mask& mask, const AttentionShape& s, int64_t b) {
  const detail::MaskEval eval(mask, s);
  std::vector<detail::KeyBand> bands;
  for (int64_t i = 0; i < s.N; ++i) bands.push_back(eval.band(b, i));
  return bands;
}

TEST(MaskBands, EveryStructuralMaskIsOrdered) {
  test::Rng rng("MaskBands.EveryStructuralMaskIsOrdered");
  for (int trial = 0; trial < 400; ++trial) {
    const AttentionShape s{2, 1, 1, rng.uniform_int(1, 70), rng.uniform_int(1, 70), 8, 8};
    Mask mask;
    if (rng.uniform_int(0, 2) > 0)
      mask.causal = rng.uniform_int(0, 1) ? CausalAlign::top_left : CausalAlign::bottom_right;
    if (rng.uniform_int(0, 1)) mask.window = Window{rng.uniform_int(-1, 20), rng.uniform_int(-1, 20)};
    if (rng.uniform_int(0, 1)) mask.key_lengths = {rng.uniform_int(0, s.M), rng.uniform_int(0, s.M)};
    if (rng.uniform_int(0, 1)) mask.query_lengths = {rng.uniform_int(0, s.N), rng.uniform_int(0, s.N)};
    for (int64_t b = 0; b < s.B; ++b) {
      const std::vector<detail::KeyBand> bands = bands_of(mask, s, b);
      SCOPED_TRACE(testing::Message() << "trial " << trial << " N " << s.N << " M " << s.M << " b " << b);
      // Any run of rows of them (a chunk of the backward) too.
      const int64_t from = rng.uniform_int(0, s.N - 1), to = rng.uniform_int(from, s.N);
      EXPECT_TRUE(detail::bands_ordered(bands.data(), s.N));
      EXPECT_TRUE(detail::bands_ordered(bands.data() + from, to - from));
    }
  }
}

TEST(MaskBands, OtherOrdersAreNotTakenForOrdered) {
  using B = detail::KeyBand;
  EXPECT_TRUE(detail::bands_ordered(std::vector<B>{{0, 0}, {0, 2}, {1, 3}, {5, 5}}.data(), 4));
  EXPECT_FALSE(detail::bands_ordered(std::vector<B>{{0, 2}, {0, 0}, {1, 3}}.data(), 3));  // a hole
  EXPECT_FALSE(detail::bands_ordered(std::vector<B>{{2, 4}, {1, 5}}.data(), 2));          // lo falls
  EXPECT_FALSE(detail::bands_ordered(std::vector<B>{{0, 4}, {1, 3}}.data(), 2));          // hi falls
  EXPECT_TRUE(detail::bands_ordered(nullptr, 0));
}

}  // namespace
}  // namespace qkv
