// Sums over many keys (or, for dk and dv, many queries): every fast path must stay within the fp32
// rule, 2e-5·(1 + max|ref|) of the float64 reference, however long the row. Flat weights over
// thousands of keys are the hard case: every term of P·V is the same size, so a sum that rounds at
// the size of the running total (each key added to O as it goes) drifts by about one rounding of
// O per key, an error that grows with M (7e-4 at M = 16384 before O took each block's sum whole).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "qkv/attention.h"
#include "qkv/backward.h"
#include "qkv/decode.h"
#include "qkv/kv_cache.h"
#include "qkv/reference.h"
#include "test_util.h"

namespace qkv {
namespace {

// Keys all alike (flat weights) and values all alike, away from 0: every term of a column's sum
// is the same number, so a running total's roundings all lean one way (random terms would let
// them cancel and hide the drift).
struct FlatRow {
  int64_t N, M, D;
  Tensor<float> q, k, v;
  FlatRow(test::Rng& rng, int64_t n, int64_t m, int64_t d) : N(n), M(m), D(d), q({1, 1, n, d}), k({1, 1, m, d}) {
    for (int64_t i = 0; i < q.numel(); ++i) q[i] = static_cast<float>(rng.uniform(-1, 1));
    std::vector<float> key(static_cast<std::size_t>(d));
    for (float& x : key) x = static_cast<float>(rng.uniform(-1, 1));
    for (int64_t j = 0; j < m; ++j) std::copy(key.begin(), key.end(), k.data() + j * d);
    v = Tensor<float>({1, 1, m, d});
    for (int64_t e = 0; e < d; ++e) v[e] = static_cast<float>(3.0 + rng.uniform(-1, 1));
    for (int64_t j = 1; j < m; ++j) std::copy(v.data(), v.data() + d, v.data() + j * d);
  }
  Tensor<double> reference_out() const {
    Tensor<double> out({1, 1, N, D});
    reference_attention_forward(out.view(), {}, {}, to_contiguous<double>(q.cview()).cview(),
                                to_contiguous<double>(k.cview()).cview(), to_contiguous<double>(v.cview()).cview());
    return out;
  }
};

TEST(LongSums, ForwardOverSixteenThousandFlatKeysOnEveryPath) {
  test::Rng rng("LongSums.Forward");
  const FlatRow row(rng, 3, 16384, 64);
  const Tensor<double> want = row.reference_out();
  for (Simd simd : test::available_paths())
    for (int threads : {1, 2}) {
      Tensor<float> out({1, 1, row.N, row.D});
      AttentionOptions options;
      options.simd = simd;
      options.num_threads = threads;
      attention_forward(out.view(), {}, row.q.cview(), row.k.cview(), row.v.cview(), options);
      EXPECT_TRUE(test::within_fp32_rule(out.data(), want.data(), out.numel()))
          << simd_path_name(simd) << ", " << threads << " threads";
    }
}

// Decode cuts a row into at most 32 chunks, merged in float64: 131072 keys give chunks of 4096.
TEST(LongSums, DecodeOverAHundredThousandFlatKeysOnEveryPath) {
  test::Rng rng("LongSums.Decode");
  const FlatRow row(rng, 1, 131072, 64);
  const Tensor<double> want = row.reference_out();
  KVCache cache(KVCacheConfig{row.M / 256, 256, 1, row.D, row.D});
  const int64_t seq = cache.create();
  cache.append(seq, TensorView<const float>(row.k.data(), {row.M, 1, row.D}),
               TensorView<const float>(row.v.data(), {row.M, 1, row.D}));
  for (Simd simd : test::available_paths()) {
    Tensor<float> out({1, 1, 1, row.D});
    DecodeOptions options;
    options.attention.simd = simd;
    options.attention.num_threads = 1;  // one task runs the whole row (the merge of chunks is another sum)
    const std::vector<int64_t> ids{seq};
    decode_attention(out.view(), {}, row.q.cview(), cache, ids, options);
    EXPECT_TRUE(test::within_fp32_rule(out.data(), want.data(), out.numel())) << simd_path_name(simd);
  }
}

// dv = Pᵀ·dout and dk sum over the queries: N = 16384 alike queries (and rows of dout) over a few keys.
TEST(LongSums, BackwardOverSixteenThousandQueriesOnEveryPath) {
  test::Rng rng("LongSums.Backward");
  const int64_t N = 16384, M = 8, D = 64;
  Tensor<float> q({1, 1, N, D}), k = rng.normal32({1, 1, M, D}), v = rng.normal32({1, 1, M, D}), dout({1, 1, N, D});
  for (int64_t i = 0; i < D; ++i) q[i] = static_cast<float>(rng.uniform(-1, 1)) * 0.1f;
  for (int64_t n = 1; n < N; ++n) std::copy(q.data(), q.data() + D, q.data() + n * D);
  for (int64_t e = 0; e < D; ++e) dout[e] = static_cast<float>(2.0 + rng.uniform(-1, 1));
  for (int64_t n = 1; n < N; ++n) std::copy(dout.data(), dout.data() + D, dout.data() + n * D);
  Tensor<double> dq({1, 1, N, D}), dk({1, 1, M, D}), dv({1, 1, M, D});
  reference_attention_backward(dq.view(), dk.view(), dv.view(), {}, to_contiguous<double>(dout.cview()).cview(),
                               to_contiguous<double>(q.cview()).cview(), to_contiguous<double>(k.cview()).cview(),
                               to_contiguous<double>(v.cview()).cview());
  for (Simd simd : test::available_paths()) {
    AttentionOptions options;
    options.simd = simd;
    Tensor<float> out({1, 1, N, D}), lse({1, 1, N});
    attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
    Tensor<float> gq({1, 1, N, D}), gk({1, 1, M, D}), gv({1, 1, M, D});
    attention_backward(gq.view(), gk.view(), gv.view(), {}, dout.cview(), q.cview(), k.cview(), v.cview(), out.cview(),
                       lse.cview(), options);
    EXPECT_TRUE(test::within_fp32_rule(gv.data(), dv.data(), gv.numel())) << "dv " << simd_path_name(simd);
    EXPECT_TRUE(test::within_fp32_rule(gk.data(), dk.data(), gk.numel())) << "dk " << simd_path_name(simd);
  }
}

}  // namespace
}  // namespace qkv
