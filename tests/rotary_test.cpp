// RoPE against its float64 formula (both layouts, offsets, partial rotary_dim, strided views), on
// append to a KVCache, and its refusals.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/kv_cache.h"
#include "qkv/rotary.h"
#include "test_util.h"

namespace qkv {
namespace {

// x [B, H, N, D] contiguous, rotated in float64 by the definition in rotary.h.
std::vector<double> rotated64(const Tensor<float>& x, const std::vector<int64_t>& offsets, const RotaryOptions& o) {
  const int64_t B = x.dim(0), H = x.dim(1), N = x.dim(2), D = x.dim(3);
  const int64_t rd = o.rotary_dim == 0 ? D : o.rotary_dim;
  std::vector<double> y(x.data(), x.data() + x.numel());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n) {
        double* row = y.data() + ((b * H + h) * N + n) * D;
        for (int64_t p = 0; p < rd / 2; ++p) {
          const double angle = static_cast<double>(offsets[b] + n) * std::pow(o.theta, -2.0 * p / rd);
          const int64_t i0 = o.layout == RotaryLayout::interleaved ? 2 * p : p;
          const int64_t i1 = o.layout == RotaryLayout::interleaved ? 2 * p + 1 : p + rd / 2;
          const double x0 = row[i0], x1 = row[i1];
          row[i0] = x0 * std::cos(angle) - x1 * std::sin(angle);
          row[i1] = x0 * std::sin(angle) + x1 * std::cos(angle);
        }
      }
  return y;
}

TEST(Rotary, MatchesFloat64Formula) {
  test::Rng rng("Rotary.Formula");
  for (RotaryLayout layout : {RotaryLayout::interleaved, RotaryLayout::half_split})
    for (int64_t rd : {0, 32, 2}) {
      RotaryOptions o;
      o.layout = layout;
      o.rotary_dim = rd;
      o.theta = rd == 32 ? 500000.0 : 10000.0;
      Tensor<float> x = rng.normal32({2, 3, 5, 40});
      const std::vector<int64_t> offsets{0, 123456};
      const std::vector<double> want = rotated64(x, offsets, o);
      apply_rotary(x.view(), offsets, o);
      double worst = 0;
      for (int64_t i = 0; i < x.numel(); ++i) worst = std::max(worst, std::fabs(x[i] - want[i]));
      EXPECT_LE(worst, 2e-6 * 8) << "layout " << static_cast<int>(layout) << " rotary_dim " << rd;
    }
}

// A [B, N, H, D] buffer rotated through a transposed view gives the same values.
TEST(Rotary, AcceptsStridedViews) {
  test::Rng rng("Rotary.Strided");
  Tensor<float> bnhd = rng.normal32({1, 7, 2, 16});
  Tensor<float> bhnd({1, 2, 7, 16});
  for (int64_t n = 0; n < 7; ++n)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 16; ++d) bhnd[(h * 7 + n) * 16 + d] = bnhd[(n * 2 + h) * 16 + d];
  const std::vector<int64_t> offsets{9};
  apply_rotary(bhnd.view(), offsets);
  apply_rotary(bnhd.view().transposed(1, 2), offsets);
  for (int64_t n = 0; n < 7; ++n)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(bhnd[(h * 7 + n) * 16 + d], bnhd[(n * 2 + h) * 16 + d]);
}

TEST(Rotary, AppendRotatesKeysAtTheSequencePositions) {
  test::Rng rng("Rotary.Append");
  KVCache cache({4, 8, 2, 16, 16, KVDtype::f32});
  const int64_t s = cache.create();
  Tensor<float> k = rng.normal32({10, 2, 16}), v = rng.normal32({10, 2, 16});
  RotaryOptions o;
  o.layout = RotaryLayout::interleaved;
  cache.append(s, TensorView<const float>(k.data(), {3, 2, 16}), TensorView<const float>(v.data(), {3, 2, 16}), &o);
  cache.append(s, TensorView<const float>(k.data() + 96, {7, 2, 16}),
               TensorView<const float>(v.data() + 96, {7, 2, 16}), &o);
  Tensor<float> khnd({1, 2, 10, 16});  // [1, Hkv, T, D] for the formula, positions 0..9
  for (int64_t t = 0; t < 10; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 16; ++d) khnd[(h * 10 + t) * 16 + d] = k[(t * 2 + h) * 16 + d];
  const std::vector<double> want = rotated64(khnd, {0}, o);
  const Tensor<float> got = cache.keys(s);
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  const Tensor<float> vals = cache.values(s);
  EXPECT_EQ(vals[16], v[32]);  // values are not rotated: head 0, token 1 in both layouts
}

// A key the storage holds can rotate past it (f16: (60000, 60000) turned by 1 radian at position
// 1 has a component 82906): refused as the rotated value, with nothing appended; a key that was
// never storable is named as the caller's.
TEST(Rotary, AppendRefusesARotatedKeyTheStorageCannotHold) {
  KVCache cache({2, 4, 1, 2, 2, KVDtype::f16});
  const int64_t s = cache.create();
  Tensor<float> k({2, 1, 2}), v({2, 1, 2}), big({1, 1, 2});
  std::fill(k.data(), k.data() + k.numel(), 60000.0f);
  std::fill(v.data(), v.data() + v.numel(), 1.0f);
  std::fill(big.data(), big.data() + big.numel(), 70000.0f);
  const RotaryOptions o;
  test::expect_error([&] { cache.append(s, k.cview(), v.cview(), &o); },
                     {"rotated k[1, 0, 1] = 82906", "cannot be stored as f16"});
  EXPECT_EQ(cache.length(s), 0);
  test::expect_error(
      [&] {
        cache.append(s, big.cview(), TensorView<const float>(v.data(), {1, 1, 2}), &o);
      },
      {"KVCache::append: k[0, 0, 0] = 70000 cannot be stored as f16"});
}

// A finite element the rotation would turn into ±inf (3e38 turned at position 1 in the half-split
// layout gives x0·cos - x1·sin = -9e37 but x0·sin + x1·cos = 4.1e38) is refused naming it, x
// unchanged, on its own and on a cache append; NaN and inf pass as the caller's own.
TEST(Rotary, RefusesAFiniteElementTurnedPastFloat32) {
  Tensor<float> x({1, 1, 2, 4});
  std::fill(x.data(), x.data() + x.numel(), 3e38f);
  const Tensor<float> before = x.clone();
  test::expect_error([&] { apply_rotary(x.view(), std::vector<int64_t>{0}); },
                     {"apply_rotary: x at token 1, element 2 = 3e+38 turns into inf at position 1 (with element 0 = "
                      "3e+38), past float32's 3.4e38; scale x down (it is unchanged)"});
  EXPECT_EQ(std::memcmp(x.data(), before.data(), sizeof(float) * x.numel()), 0);
  Tensor<float> two_heads({2, 2, 1, 2});
  std::fill(two_heads.data(), two_heads.data() + two_heads.numel(), 1.0f);
  two_heads[7] = 3e38f, two_heads[6] = 3e38f;  // batch row 1, head 1
  test::expect_error(
      [&] {
        apply_rotary(two_heads.view(), std::vector<int64_t>{1, 1});
      },
      {"x at batch row 1, head 1, token 0, element 1 = 3e+38 turns into inf at position 1"});
  KVCache cache({2, 4, 1, 4, 4, KVDtype::f32});
  const int64_t s = cache.create();
  Tensor<float> k({2, 1, 4}), v({2, 1, 4});
  std::fill(k.data(), k.data() + k.numel(), 3e38f);
  std::fill(v.data(), v.data() + v.numel(), 1.0f);
  const RotaryOptions o;
  test::expect_error([&] { cache.append(s, k.cview(), v.cview(), &o); }, {"token 1, element 2 = 3e+38 turns into inf"});
  EXPECT_EQ(cache.length(s), 0);
  x[0] = std::numeric_limits<float>::infinity(), x[2] = 1.0f, x[4] = x[5] = x[6] = x[7] = 1.0f;
  apply_rotary(x.view(), std::vector<int64_t>{0});  // token 0 does not turn; inf is the caller's own
  EXPECT_EQ(x[0], std::numeric_limits<float>::infinity());
}

// An empty last dimension has nothing to rotate, as N = 0 has not: x stays as it is (and its
// zero strides are no shared memory); a rotary_dim above it is still refused.
TEST(Rotary, AnEmptyHeadIsLeftAsItIs) {
  for (const std::array<int64_t, 4> shape : {std::array<int64_t, 4>{1, 2, 3, 0}, {2, 1, 0, 4}}) {
    Tensor<float> x(shape);
    EXPECT_FALSE(may_self_overlap(x.cview()));
    apply_rotary(x.view(), {});
  }
  Tensor<float> x({1, 1, 3, 0});
  RotaryOptions o;
  o.rotary_dim = 2;
  test::expect_error([&] { apply_rotary(x.view(), {}, o); }, {"rotary_dim = 2 must be even and in [2, D = 0]"});
}

TEST(Rotary, RefusesBadOptions) {
  Tensor<float> x({1, 1, 2, 6});
  auto expect_error = [&](const RotaryOptions& o, std::vector<int64_t> offsets, const std::string& text) {
    test::expect_error([&] { apply_rotary(x.view(), offsets, o); }, {text});
  };
  RotaryOptions o;
  o.rotary_dim = 3;
  expect_error(o, {}, "rotary_dim = 3 must be even and in [2, D = 6]");
  o.rotary_dim = 8;
  expect_error(o, {}, "rotary_dim = 8 must be even");
  o = {};
  o.theta = 0;
  expect_error(o, {}, "theta = 0 must be positive");
  expect_error({}, {-1}, "offsets[0] = -1 is negative");
  expect_error({}, {1, 2}, "2 offsets for B = 1 batch rows");
}

// Every argument is checked before any row turns (a negative second offset left the first row
// rotated), an offset whose last token passes position 2^63 - 1 is refused rather than wrapped,
// and an append with rotary names its own misshapen k, not the rotation's rotary_dim.
TEST(Rotary, RefusesBadArgumentsBeforeRotatingAnything) {
  Tensor<float> x({2, 1, 3, 4});
  std::fill(x.data(), x.data() + x.numel(), 1.0f);
  auto expect_untouched = [&](std::vector<int64_t> offsets, const RotaryOptions& o, const std::string& text) {
    test::expect_error([&] { apply_rotary(x.view(), offsets, o); }, {text});
    for (int64_t e = 0; e < x.numel(); ++e) ASSERT_EQ(x[e], 1.0f) << text << " element " << e;
  };
  const int64_t max = std::numeric_limits<int64_t>::max();
  expect_untouched({5, -1}, {}, "apply_rotary: offsets[1] = -1 is negative");
  expect_untouched({0, max - 1}, {},
                   "apply_rotary: offsets[1] = 9223372036854775806 puts token 2 past position 2^63 - 1");
  RotaryOptions o;
  o.layout = static_cast<RotaryLayout>(7);
  expect_untouched({}, o, "apply_rotary: layout = 7 is not a RotaryLayout (interleaved or half_split)");
  test::expect_error(
      [&] {
        apply_rotary(TensorView<float>(x.data(), {1, 1, -2, 4}), {});
      },
      {"apply_rotary: x: negative dimension in shape [1, 1, -2, 4]"});
  // A row shared by every head turned once per head; a subnormal theta made every angle infinite.
  const std::array<int64_t, 4> shape{2, 3, 3, 4}, shared{12, 0, 4, 1};
  test::expect_error([&] { apply_rotary(TensorView<float>(x.data(), shape, shared), {}); },
                     {"apply_rotary: x: its strides make elements share memory"});
  o = {};
  o.theta = 5e-324;  // the last pair's frequency of 64 elements passes 1e308
  Tensor<float> wide({1, 1, 2, 64});
  test::expect_error([&] { apply_rotary(wide.view(), {}, o); },
                     {"apply_rotary: theta = 5e-324 gives an infinite angle"});
  test::expect_error(
      [&] {
        apply_rotary(TensorView<float>(nullptr, {1, 1, 3, 4}), {});
      },
      {"apply_rotary: x: a null data pointer for shape [1, 1, 3, 4]"});
  apply_rotary(x.view(), std::vector<int64_t>{0, max - 2});  // the last token at 2^63 - 1 itself
  for (int64_t e = 0; e < x.numel(); ++e) EXPECT_TRUE(std::isfinite(x[e]));

  KVCache cache({2, 4, 1, 8, 8});
  const int64_t s = cache.create();
  Tensor<float> k({1, 1, 7}), v({1, 1, 8});
  const RotaryOptions rope;
  test::expect_error([&] { cache.append(s, k.cview(), v.cview(), &rope); },
                     {"KVCache::append: k has shape [1, 1, 7], expected [T, Hkv = 1, D = 8]"});
  test::expect_error(
      [&] {
        cache.append(s, TensorView<const float>(nullptr, {1, 1, 8}), v.cview());
      },
      {"KVCache::append: k: a null data pointer for shape [1, 1, 8]"});
  EXPECT_EQ(cache.length(s), 0);
}

}  // namespace
}  // namespace qkv
