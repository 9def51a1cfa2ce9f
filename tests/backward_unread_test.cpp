// What the backward never reads: keys that no row's band reaches (past key_lengths, or before the
// first row's window) and rows whose band is empty (past query_lengths). The forward ignores them,
// as FlashAttention's varlen never touches padding, so they may hold anything, inf and NaN
// included, and the gradients must be those of the same call with zeros there, on every path.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "qkv/attention.h"
#include "qkv/backward.h"
#include "test_util.h"

namespace qkv {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Inputs {
  Tensor<float> q, k, v, dout;
};

struct Outputs {
  Tensor<float> out, lse, dq, dk, dv;
};

Outputs run(const Inputs& in, const AttentionShape& s, const AttentionOptions& options) {
  Outputs o{Tensor<float>({s.B, s.H, s.N, s.Dv}), Tensor<float>({s.B, s.H, s.N}), Tensor<float>(in.q.shape()),
            Tensor<float>(in.k.shape()), Tensor<float>(in.v.shape())};
  attention_forward(o.out.view(), o.lse.view(), in.q.cview(), in.k.cview(), in.v.cview(), options);
  attention_backward(o.dq.view(), o.dk.view(), o.dv.view(), {}, in.dout.cview(), in.q.cview(), in.k.cview(),
                     in.v.cview(), o.out.cview(), o.lse.cview(), options);
  return o;
}

// Element by element with ==, so 0 and -0 agree (a product with a zero row may flip a zero's sign).
void expect_same(const Tensor<float>& got, const Tensor<float>& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel());
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))
        << what << " element " << i << ": " << got[i] << " against " << want[i];
}

// Runs the clean inputs and, with inf and NaN written where no row reads, the dirty ones, on every
// path and 1, 2 and 3 threads: every output must be the clean run's, and the gradients of what is
// never read exactly 0.
void check_unread(const char* seed, const AttentionShape& s, Mask mask,
                  const std::function<bool(int64_t, int64_t)>& key_read,
                  const std::function<bool(int64_t, int64_t)>& row_read) {
  test::Rng rng(seed);
  Inputs clean{rng.normal32({s.B, s.H, s.N, s.D}), rng.normal32({s.B, s.Hkv, s.M, s.D}),
               rng.normal32({s.B, s.Hkv, s.M, s.Dv}), rng.normal32({s.B, s.H, s.N, s.Dv})};
  Inputs dirty{clean.q.clone(), clean.k.clone(), clean.v.clone(), clean.dout.clone()};
  int64_t poisoned = 0;
  // Row x of head h of batch row b: inf and NaN in the dirty tensor, zeros in the clean one.
  auto poison = [&poisoned](Tensor<float>& dirty_t, Tensor<float>& clean_t, int64_t b, int64_t h, int64_t x) {
    for (int64_t d = 0; d < dirty_t.dim(3); ++d) {
      dirty_t.view()(b, h, x, d) = (x + d) % 2 ? kNaN : -kInf;
      clean_t.view()(b, h, x, d) = 0.0f;
    }
    ++poisoned;
  };
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t j = 0; j < s.M; ++j)
      for (int64_t h = 0; h < s.Hkv && !key_read(b, j); ++h) {
        poison(dirty.k, clean.k, b, h, j);
        poison(dirty.v, clean.v, b, h, j);
      }
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t h = 0; h < s.H && !row_read(b, i); ++h) {
        poison(dirty.q, clean.q, b, h, i);
        poison(dirty.dout, clean.dout, b, h, i);
      }
  }
  ASSERT_GT(poisoned, 0) << "the case must leave something unread";
  std::vector<std::pair<Kernel, Simd>> paths = {{Kernel::reference, Simd::scalar}};
  for (Simd simd : test::available_paths()) paths.push_back({Kernel::fused, simd});
  for (const auto& [kernel, simd] : paths)
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(std::string(kernel == Kernel::reference ? "reference" : simd_path_name(simd)) + ", " +
                   std::to_string(threads) + " threads, seed " + seed);
      AttentionOptions options;
      options.mask = mask;
      options.kernel = kernel;
      options.simd = simd;
      options.num_threads = threads;
      const Outputs want = run(clean, s, options), got = run(dirty, s, options);
      expect_same(got.out, want.out, "out");
      expect_same(got.lse, want.lse, "lse");
      expect_same(got.dq, want.dq, "dq");
      expect_same(got.dk, want.dk, "dk");
      expect_same(got.dv, want.dv, "dv");
      for (int64_t b = 0; b < s.B; ++b) {
        for (int64_t j = 0; j < s.M; ++j)
          for (int64_t h = 0; h < s.Hkv && !key_read(b, j); ++h)
            for (int64_t d = 0; d < s.D; ++d) ASSERT_EQ(got.dk.view()(b, h, j, d), 0.0f) << "key " << j;
        for (int64_t i = 0; i < s.N; ++i)
          for (int64_t h = 0; h < s.H && !row_read(b, i); ++h)
            for (int64_t d = 0; d < s.D; ++d) ASSERT_EQ(got.dq.view()(b, h, i, d), 0.0f) << "row " << i;
      }
    }
}

// Lengths that end inside a tile (64) and inside a query chunk, with grouped heads and odd dims.
TEST(Backward, PaddingPastTheLengthsIsNeverRead) {
  const AttentionShape s{2, 4, 2, 150, 203, 59, 40};
  Mask mask;
  mask.key_lengths = {97, 203};
  mask.query_lengths = {150, 71};
  check_unread(
      "Backward.PaddingPastTheLengths", s, mask, [&](int64_t b, int64_t j) { return j < mask.key_lengths[b]; },
      [&](int64_t b, int64_t i) { return i < mask.query_lengths[b]; });
}

// Bottom-right causal with a window: the first keys (up to inside the third tile) are before every
// row's window, and under query_lengths the last rows read nothing.
TEST(Backward, KeysBeforeEveryWindowAreNeverRead) {
  const AttentionShape s{1, 2, 1, 37, 180, 64, 64};
  Mask mask;
  mask.causal = CausalAlign::bottom_right;
  mask.window = Window{5, 0};
  mask.query_lengths = {30};
  // Row i's diagonal is i + 180 - 30, so the first row's window starts at key 145.
  check_unread(
      "Backward.KeysBeforeEveryWindow", s, mask, [](int64_t, int64_t j) { return j >= 145; },
      [](int64_t, int64_t i) { return i < 30; });
}

}  // namespace
}  // namespace qkv
