// What decode keeps between calls: a batched step's partial results (one per chunk, KV head and
// query row) are freed at its end when they outgrow the kernels' ceiling (kKeptScratchBytes).
#include <malloc.h>

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/decode.h"
#include "qkv/kv_cache.h"
#include "test_util.h"

namespace qkv {
namespace {

// 16 sequences of 1024 tokens (two chunks each), 16 new queries of 8 heads sharing a KV head, and
// values of 512: 32 tasks of 128 rows × 514 floats, 8.4 MB of partial results.
TEST(DecodeScratch, LargePartialResultsAreNotKeptAfterTheCall) {
  test::Rng rng("DecodeScratch.LargePartialResults");
  constexpr int64_t B = 16, len = 1024, G = 8, N = 16, D = 8, Dv = 512;
  KVCache cache({B * len / 256 + 1, 256, 1, D, Dv, KVDtype::f16});
  std::vector<int64_t> ids;
  const Tensor<float> k = rng.normal32({len, 1, D}), v = rng.normal32({len, 1, Dv});
  for (int64_t b = 0; b < B; ++b) {
    ids.push_back(cache.create());
    cache.append(ids.back(), k.cview(), v.cview());
  }
  const Tensor<float> q = rng.normal32({B, G, N, D});
  Tensor<float> out({B, G, N, Dv}), lse({B, G, N});
  DecodeOptions o;
  o.attention.num_threads = 1;  // other threads' allocations would not show in the main arena
  const PagedKV kv = cache.paged(ids);
  const struct mallinfo2 m0 = mallinfo2();
  decode_attention(out.view(), lse.view(), q.cview(), kv, o);
  const struct mallinfo2 m1 = mallinfo2();
  const int64_t grew = static_cast<int64_t>((m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd));
  EXPECT_LE(grew, 1 << 20) << "the step's 8.4 MB of partial results were kept";
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(out[i])) << i;
}

}  // namespace
}  // namespace qkv
