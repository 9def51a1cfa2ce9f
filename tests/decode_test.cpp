// decode_attention against a paged cache: equal (to fp32 rounding) to a float64 reference on the
// stored keys and values and to the prefill kernel, for every storage dtype, mask, sinks, GQA
// ratio, page size, shuffled page order and 1-16 queries; int8 within a bound derived from its
// quantization step; bitwise the same for 1, 2 and 3 threads; bad input refused by name.
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "decode_cases.h"
#include "qkv/kv_cache.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::Case;
using test::describe;
using test::fill;
using test::Filled;
using test::make_case;
using test::max_abs;
using test::max_diff;
using test::reference;
using test::Result;
using test::run_decode;
using test::run_prefill;

// One sequence of `len` tokens in pages of 4, with Hkv key heads of G query heads each and head
// dims D: the cache of the tests of refused input.
Filled small_cache(test::Rng& rng, int64_t Hkv, int64_t G, int64_t D, int64_t len) {
  Case c;
  c.Hkv = Hkv, c.G = G, c.N = 1, c.D = D, c.Dv = D, c.page_tokens = 4;
  c.lens = {len};
  return fill(rng, c);
}

TEST(Decode, MatchesFloat64ReferenceAndPrefillOnStoredValues) {
  test::Rng rng("Decode.Matches");
  for (int idx = 0; idx < 48; ++idx) {
    const Case c = make_case(rng, idx);
    const Filled f = fill(rng, c);
    const int64_t B = static_cast<int64_t>(c.lens.size()), H = c.Hkv * c.G;
    const Tensor<float> q = rng.normal32({B, H, c.N, c.D});
    std::vector<Tensor<float>> ks, vs;
    for (int64_t id : f.ids) {
      ks.push_back(f.cache.keys(id));
      vs.push_back(f.cache.values(id));
    }
    Tensor<double> ref({B, H, c.N, c.Dv}), ref_lse({B, H, c.N});
    reference(c, q, ks, vs, false, ref, ref_lse);
    const double tol = 2e-5 * (1 + max_abs(ref));
    const bool prefill_can = c.options.sink_tokens == 0;
    const Tensor<float> prefill = prefill_can ? run_prefill(c, f, q) : Tensor<float>();
    for (Simd simd : test::available_paths()) {
      const Result r = run_decode(c, f, q, simd, 2);
      EXPECT_LE(max_diff(r.out, ref), tol) << describe(c) << " " << simd_path_name(simd);
      EXPECT_LE(max_diff(r.lse, ref_lse), 2e-5 * (1 + max_abs(ref_lse))) << describe(c) << " " << simd_path_name(simd);
      if (prefill_can) {
        double d = 0;
        for (int64_t i = 0; i < prefill.numel(); ++i) d = std::max<double>(d, std::fabs(prefill[i] - r.out[i]));
        EXPECT_LE(d, 2 * tol) << "vs prefill: " << describe(c) << " " << simd_path_name(simd);
      }
    }
  }
}

// Scores rising along the sequence move a row's running max block after block, by more than
// ln 8 a block (l and O rescaled), by less (weights above 1 until the final division) or not at
// all (falling). Key j = t_j u + noise / 10 for a unit u per KV head and q = sqrt(D) u, so its
// score is t_j, rising linearly to `rise`, give or take 0.1.
TEST(Decode, RisingScoresMatchFloat64Reference) {
  test::Rng rng("Decode.Rising");
  for (double rise : {60.0, 11.0, -30.0})
    for (KVDtype dtype : {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8}) {
      Case c;
      c.dtype = dtype, c.Hkv = 2, c.G = 4, c.D = 128, c.Dv = 128, c.page_tokens = 64, c.lens = {1500, 333};
      const int64_t H = c.Hkv * c.G;
      Tensor<float> u = rng.normal32({c.Hkv, c.D}), q({2, H, 1, c.D});
      for (int64_t g = 0; g < c.Hkv; ++g) {
        const double n = std::sqrt(std::inner_product(&u[g * c.D], &u[g * c.D] + c.D, &u[g * c.D], 0.0));
        for (int64_t d = 0; d < c.D; ++d) u[g * c.D + d] = static_cast<float>(u[g * c.D + d] / n);
      }
      for (int64_t i = 0; i < q.numel(); ++i)
        q[i] = std::sqrt(static_cast<float>(c.D)) * u[(i / c.D % H) / c.G * c.D + i % c.D];
      const Filled f = fill(rng, c, 0, [&](Tensor<float>& k) {
        const int64_t row = c.Hkv * c.D, len = k.numel() / row;
        for (int64_t i = 0; i < k.numel(); ++i)
          k[i] = static_cast<float>(0.1 * k[i] +
                                    rise * static_cast<double>(i / row) / static_cast<double>(len) * u[i % row]);
      });
      std::vector<Tensor<float>> ks, vs;
      for (int64_t id : f.ids) ks.push_back(f.cache.keys(id)), vs.push_back(f.cache.values(id));
      Tensor<double> ref({2, H, 1, c.Dv}), ref_lse({2, H, 1});
      reference(c, q, ks, vs, false, ref, ref_lse);
      for (Simd simd : test::available_paths()) {
        const Result r = run_decode(c, f, q, simd, 1), r3 = run_decode(c, f, q, simd, 3);
        const std::string what =
            std::string(kv_dtype_name(dtype)) + " rise " + std::to_string(rise) + " " + simd_path_name(simd);
        EXPECT_LE(max_diff(r.out, ref), 2e-5 * (1 + max_abs(ref))) << what;
        EXPECT_LE(max_diff(r.lse, ref_lse), 2e-5 * (1 + max_abs(ref_lse))) << what;
        EXPECT_EQ(std::memcmp(r.out.data(), r3.out.data(), sizeof(float) * r.out.numel()), 0) << what;
      }
    }
}

TEST(Decode, OutputsAreBitwiseEqualFor1_2_3Threads) {
  test::Rng rng("Decode.Threads");
  // Pages of 32 and 256 tokens: the two task orders of decode.cpp; f32 at D = 128 also takes the
  // short blocks of wide rows (decode_block_keys) on every path but AVX-512.
  for (auto [dtype, page_tokens, D] : {std::tuple{KVDtype::f32, 32, 128}, std::tuple{KVDtype::f16, 32, 64},
                                       std::tuple{KVDtype::i8, 32, 64}, std::tuple{KVDtype::f16, 256, 64}}) {
    Case c;
    c.dtype = dtype;
    c.Hkv = 2, c.G = 4, c.N = 3, c.D = D, c.Dv = D, c.page_tokens = page_tokens;
    c.lens = {12001, 777, 5};  // 12001 keys: enough chunks that the merge, too, takes threads
    c.options.attention.mask.causal = CausalAlign::bottom_right;
    c.options.sinks = {0.5f, -1, 2, 0, 1, 1, 1, 1};
    const Filled f = fill(rng, c);
    const Tensor<float> q = rng.normal32({3, 8, 3, D});
    for (Simd simd : test::available_paths()) {
      const Result one = run_decode(c, f, q, simd, 1);
      for (int threads : {2, 3, 100000}) {  // 100000: capped (resolve_num_threads), not a crash
        const Result r = run_decode(c, f, q, simd, threads);
        EXPECT_EQ(std::memcmp(one.out.data(), r.out.data(), sizeof(float) * r.out.numel()), 0)
            << kv_dtype_name(dtype) << " pages of " << page_tokens << " " << simd_path_name(simd) << " threads "
            << threads;
        EXPECT_EQ(std::memcmp(one.lse.data(), r.lse.data(), sizeof(float) * r.lse.numel()), 0);
      }
    }
  }
}

// out and lse may have any strides (decode.h): views with the head axis moved and a gap after
// every element hold bitwise what a contiguous call writes, and the gaps stay untouched.
TEST(Decode, StridedOutputsMatchContiguousOnes) {
  test::Rng rng("Decode.Strided");
  Case c;
  c.dtype = KVDtype::f16;
  c.Hkv = 2, c.G = 2, c.N = 3, c.D = 40, c.Dv = 24, c.page_tokens = 16;
  c.lens = {700, 33};  // 700 keys: two chunks to merge
  c.options.sinks = {0.5f, -1, 2, 0};
  const Filled f = fill(rng, c);
  const int64_t B = 2, H = 4, N = c.N, Dv = c.Dv;
  const Tensor<float> q = rng.normal32({B, H, N, c.D});
  for (Simd simd : test::available_paths()) {
    const Result dense = run_decode(c, f, q, simd, 2);
    std::vector<float> obuf(static_cast<std::size_t>(B * H * N * Dv * 2), NAN);
    std::vector<float> lbuf(static_cast<std::size_t>(B * H * N * 3), NAN);
    const std::array<int64_t, 4> oshape{B, H, N, Dv}, ostrides{N * Dv * H * 2, 2, Dv * H * 2, H * 2};
    const std::array<int64_t, 3> lshape{B, H, N}, lstrides{H * N * 3, 3, H * 3};
    DecodeOptions o = c.options;
    o.attention.simd = simd;
    o.attention.num_threads = 2;
    decode_attention(TensorView<float>(obuf.data(), oshape, ostrides), TensorView<float>(lbuf.data(), lshape, lstrides),
                     q.cview(), f.cache, f.ids, o);
    int64_t written = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < N; ++i) {
          const float lse = lbuf[b * lstrides[0] + h * lstrides[1] + i * lstrides[2]];
          EXPECT_EQ(std::memcmp(&lse, &dense.lse[(b * H + h) * N + i], sizeof(float)), 0) << simd_path_name(simd);
          for (int64_t e = 0; e < Dv; ++e, ++written) {
            const float x = obuf[b * ostrides[0] + h * ostrides[1] + i * ostrides[2] + e * ostrides[3]];
            ASSERT_EQ(std::memcmp(&x, &dense.out[((b * H + h) * N + i) * Dv + e], sizeof(float)), 0)
                << simd_path_name(simd) << " (" << b << ", " << h << ", " << i << ", " << e << ")";
          }
        }
    EXPECT_EQ(std::count_if(obuf.begin(), obuf.end(), [](float x) { return std::isnan(x); }),
              static_cast<std::ptrdiff_t>(obuf.size()) - written);
  }
}

// int8 against the float64 reference on the values before quantization. Every stored value is
// within step/2 of the original (step = max|x| / 127 of its token and head; kv_cache_test), so a
// logit moves by at most Δ = scale · ‖q‖₁ · max stepk / 2 a priori; the test measures the actual
// Δ = max |scale · q·(k' - k)| and ε = max |v' - v| (both within those steps). The weights then
// move by a factor within e^{±2Δ}, so |out' - out| <= ε + (e^{2Δ} - 1) · max|v| + fp32 rounding.
TEST(Decode, Int8WithinTheBoundOfItsQuantizationStep) {
  test::Rng rng("Decode.Int8Bound");
  for (double outlier : {0.0, 40.0}) {
    Case c;
    c.dtype = KVDtype::i8;
    c.Hkv = 2, c.G = 4, c.N = 2, c.D = 128, c.Dv = 128, c.page_tokens = 64;
    c.lens = {1500, 300};
    c.options.attention.mask.causal = CausalAlign::bottom_right;
    const Filled f = fill(rng, c, outlier);
    const Tensor<float> q = rng.normal32({2, 8, 2, 128});
    Tensor<double> ref({2, 8, 2, 128}), ref_lse({2, 8, 2});
    reference(c, q, f.k, f.v, true, ref, ref_lse);
    const double scale = 1 / std::sqrt(128.0);
    double delta = 0, prior = 0, eps = 0, vmax = 0;
    for (std::size_t b = 0; b < 2; ++b) {
      const Tensor<float> ks = f.cache.keys(f.ids[b]), vs = f.cache.values(f.ids[b]);
      const int64_t len = c.lens[b];
      for (int64_t g = 0; g < 2; ++g)
        for (int64_t j = 0; j < len; ++j) {
          const float* k = &f.k[b][(j * 2 + g) * 128];
          const float* v = &f.v[b][(j * 2 + g) * 128];
          double kmax = 0;
          for (int64_t d = 0; d < 128; ++d) {
            kmax = std::max<double>(kmax, std::fabs(k[d]));
            vmax = std::max<double>(vmax, std::fabs(v[d]));
            eps = std::max<double>(eps, std::fabs(vs[(g * len + j) * 128 + d] - v[d]));
          }
          for (int64_t r = 0; r < 4 * 2; ++r) {  // the rows of head group g
            const float* qr = &q[((b * 8 + g * 4) * 2 + r) * 128];
            double dot = 0, q1 = 0;
            for (int64_t d = 0; d < 128; ++d) {
              dot += static_cast<double>(qr[d]) * (ks[(g * len + j) * 128 + d] - static_cast<double>(k[d]));
              q1 += std::fabs(qr[d]);
            }
            delta = std::max(delta, scale * std::fabs(dot));
            prior = std::max(prior, scale * q1 * kmax / 127 / 2);
          }
        }
    }
    ASSERT_LE(delta, prior * (1 + 1e-6));
    const double bound = eps + std::expm1(2 * delta) * vmax + 2e-5 * (1 + max_abs(ref));
    const Result r = run_decode(c, f, q, Simd::automatic, 2);
    const double err = max_diff(r.out, ref);
    EXPECT_LE(err, bound) << "outlier " << outlier;
    std::printf(
        "[ int8     ] outlier %g: max error %.3g, bound %.3g (logit shift %.3g <= %.3g a priori, v error %.3g)\n",
        outlier, err, bound, delta, prior, eps);
  }
}

// 262144 keys of one sequence: correct, and the decode step's scratch does not grow with M.
TEST(Decode, LongSequenceNeedsNoScratchProportionalToLength) {
  test::Rng rng("Decode.Long");
  Case c;
  c.Hkv = 1, c.G = 2, c.N = 1, c.D = 8, c.Dv = 8, c.page_tokens = 256;
  c.lens = {262144};
  const Filled f = fill(rng, c);
  const Tensor<float> q = rng.normal32({1, 2, 1, 8});
  Tensor<double> ref({1, 2, 1, 8}), ref_lse({1, 2, 1});
  reference(c, q, f.k, f.v, true, ref, ref_lse);
  const PagedKV kv = f.cache.paged(f.ids);  // its block table (1024 entries) belongs to the caller
  Tensor<float> out({1, 2, 1, 8}), lse({1, 2, 1});
  DecodeOptions o;
  o.attention.num_threads = 1;  // other threads' allocations would not show in the main arena
  const struct mallinfo2 m0 = mallinfo2();
  decode_attention(out.view(), lse.view(), q.cview(), kv, o);
  const struct mallinfo2 m1 = mallinfo2();
  const int64_t grew = static_cast<int64_t>((m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd));
  EXPECT_LE(grew, 64 * 1024) << "262144 keys would need >= 1 MB per float per key";
  EXPECT_LE(max_diff(out, ref), 2e-5 * (1 + max_abs(ref)));
}

// The exact per-key weights reproduce the decode output (Σ_j w_j v_j = out), sum to the share the
// sink leaves, and are 0 outside the window and StreamingLLM prefix.
TEST(Decode, WeightsReproduceTheOutput) {
  test::Rng rng("Decode.Weights");
  Case c;
  c.dtype = KVDtype::f16;
  c.Hkv = 2, c.G = 4, c.N = 3, c.D = 40, c.Dv = 24, c.page_tokens = 16;
  c.lens = {300, 2};
  c.options.attention.mask.causal = CausalAlign::bottom_right;
  c.options.attention.mask.window = Window{50, -1};
  c.options.sink_tokens = 4;
  for (int64_t h = 0; h < 8; ++h) c.options.sinks.push_back(static_cast<float>(rng.uniform(-1, 2)));
  const Filled f = fill(rng, c);
  const Tensor<float> q = rng.normal32({2, 8, 3, 40});
  const Result r = run_decode(c, f, q, Simd::automatic, 2);
  const PagedKV kv = f.cache.paged(f.ids);
  for (bool given_lse : {true, false}) {
    Tensor<float> w({2, 8, 3, 300});
    decode_attention_weights(w.view(), q.cview(), kv, given_lse ? r.lse.cview() : TensorView<const float>(), c.options);
    for (int64_t b = 0; b < 2; ++b) {
      const Tensor<float> vs = f.cache.values(f.ids[b]);
      const int64_t len = c.lens[b];
      for (int64_t h = 0; h < 8; ++h)
        for (int64_t i = 0; i < 3; ++i) {
          const float* wr = &w[((b * 8 + h) * 3 + i) * 300];
          double sum = 0;
          for (int64_t j = 0; j < 300; ++j) {
            const int64_t diag = i + len - 3;
            const bool allowed = j < len && j <= diag && (j >= diag - 50 || j < 4);
            if (!allowed) {
              ASSERT_EQ(wr[j], 0.0f) << b << " " << h << " " << i << " " << j;
            }
            sum += wr[j];
          }
          const double lse = r.lse[(b * 8 + h) * 3 + i];
          const double want_sum = std::isinf(lse) ? 0.0 : 1.0 - std::exp(c.options.sinks[h] - lse);
          EXPECT_NEAR(sum, want_sum, 1e-5) << b << " " << h << " " << i;
          for (int64_t e = 0; e < 24; ++e) {
            double o = 0;
            for (int64_t j = 0; j < len; ++j) o += wr[j] * static_cast<double>(vs[((h / 4) * len + j) * 24 + e]);
            EXPECT_NEAR(o, r.out[((b * 8 + h) * 3 + i) * 24 + e], 2e-5 * 4) << b << " " << h << " " << i << " " << e;
          }
        }
    }
  }
  Tensor<float> wrong({2, 8, 3, 299});
  EXPECT_THROW(decode_attention_weights(wrong.view(), q.cview(), kv, {}, c.options), Error);
}

// The top-k weights are the largest entries of the full weights (ties to the lower key), -1/0
// past a row's allowed keys; bad k and shapes are refused by name.
TEST(Decode, TopKWeightsAreTheLargestOfTheFullRow) {
  test::Rng rng("Decode.TopK");
  Case c;
  c.dtype = KVDtype::i8;
  c.Hkv = 2, c.G = 2, c.N = 2, c.D = 40, c.Dv = 8, c.page_tokens = 16;
  c.lens = {97, 3};
  c.options.attention.mask.causal = CausalAlign::bottom_right;
  c.options.attention.mask.window = Window{40, -1};
  const Filled f = fill(rng, c);
  const Tensor<float> q = rng.normal32({2, 4, 2, 40});
  const PagedKV kv = f.cache.paged(f.ids);
  Tensor<float> full({2, 4, 2, 97});
  decode_attention_weights(full.view(), q.cview(), kv, {}, c.options);
  constexpr int64_t K = 8;
  Tensor<float> values({2, 4, 2, K});
  Tensor<int64_t> indices({2, 4, 2, K});
  decode_attention_top_k(values.view(), indices.view(), q.cview(), kv, {}, K, c.options);
  for (int64_t row = 0; row < 2 * 4 * 2; ++row) {
    const float* w = &full[row * 97];
    std::vector<int64_t> want(97);
    std::iota(want.begin(), want.end(), 0);
    std::stable_sort(want.begin(), want.end(), [w](int64_t x, int64_t y) { return w[x] > w[y]; });
    for (int64_t t = 0; t < K; ++t) {
      const int64_t got = indices[row * K + t];
      if (w[want[t]] == 0.0f) {  // fewer allowed keys than K (sequence 1 has 3 tokens)
        EXPECT_EQ(got, -1) << row << " " << t;
        EXPECT_EQ(values[row * K + t], 0.0f);
        continue;
      }
      EXPECT_EQ(got, want[t]) << row << " " << t;
      EXPECT_EQ(values[row * K + t], w[want[t]]) << row << " " << t;
    }
  }
  Tensor<float> small({2, 4, 2, K - 1});
  test::expect_error([&] { decode_attention_top_k(small.view(), indices.view(), q.cview(), kv, {}, K, c.options); },
                     {"must have one shape"});
  test::expect_error([&] { decode_attention_top_k(values.view(), indices.view(), q.cview(), kv, {}, 0, c.options); },
                     {"top_k must be at least 1"});
}

TEST(Decode, RefusesBadInputByName) {
  test::Rng rng("Decode.Errors");
  const Filled f = small_cache(rng, 2, 2, 8, 10);
  const Tensor<float> q = rng.normal32({1, 4, 1, 8});
  Tensor<float> out({1, 4, 1, 8});
  auto expect_error = [&](const PagedKV& kv, TensorView<const float> qv, const DecodeOptions& o,
                          const std::string& text) {
    test::expect_error([&] { decode_attention(out.view(), TensorView<float>(), qv, kv, o); }, {text});
  };
  const PagedKV good = f.cache.paged(f.ids);
  PagedKV bad = good;
  bad.block_table[1] = static_cast<int32_t>(good.num_pages);
  expect_error(bad, q.cview(), {},
               "block_table[0, 1] = " + std::to_string(good.num_pages) + " points outside the pool");
  bad = good;
  bad.block_table[0] = -1;
  expect_error(bad, q.cview(), {}, "block_table[0, 0] = -1 points outside the pool");
  bad = good;
  bad.seq_lens[0] = 13;
  expect_error(bad, q.cview(), {}, "seq_lens[0] = 13 is outside [0, max_blocks · page_tokens = 12]");
  const Tensor<float> q7 = rng.normal32({1, 4, 1, 7});
  expect_error(good, q7.cview(), {}, "mismatched head dims: q has D = 7, the cache D = 8");
  const Tensor<float> q3 = rng.normal32({1, 3, 1, 8});
  expect_error(good, q3.cview(), {}, "query heads is not a positive multiple of Hkv");
  DecodeOptions o;
  o.sinks = {1, 2};
  expect_error(good, q.cview(), o, "sinks has 2 entries, expected one per query head (H = 4)");
  o.sinks = {1, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 0};
  expect_error(good, q.cview(), o, "sinks[2] = nan must be a finite logit or -inf (no sink)");
  o.sinks[2] = std::numeric_limits<float>::infinity();
  expect_error(good, q.cview(), o, "sinks[2] = inf must be a finite logit or -inf (no sink)");
  o = {};
  o.attention.mask.key_lengths = {3};
  expect_error(good, q.cview(), o, "mask.key_lengths must be empty");
  o = {};
  o.sink_tokens = -1;
  expect_error(good, q.cview(), o, "sink_tokens = -1 is negative");
  o = {};
  o.attention.kernel = Kernel::reference;
  expect_error(good, q.cview(), o, "there is no reference kernel for decode");
  o = {};
  o.attention.dropout.p = 0.5;
  expect_error(good, q.cview(), o, "dropout is not supported");
  const std::vector<int64_t> ids{99};
  test::expect_error([&] { decode_attention(out.view(), TensorView<float>(), q.cview(), f.cache, ids); },
                     {"unknown sequence id 99"});
  // A NaN in q, or scores past fp32 (q 1e38 with a scale of 1e30): both were merged into out = 0,
  // lse = -inf as if every key were masked.
  Tensor<float> q_nan = rng.normal32({1, 4, 1, 8});
  q_nan[9] = std::numeric_limits<float>::quiet_NaN();
  expect_error(good, q_nan.cview(), {}, "q[0, 1, 0, 1] = nan must be finite");
  Tensor<float> q_huge({1, 4, 1, 8});
  for (int64_t e = 0; e < q_huge.numel(); ++e) q_huge[e] = 1e38f;
  for (int threads : {1, 2}) {
    o = {};
    o.attention.num_threads = threads;
    o.attention.scale = 1e30;
    expect_error(good, q_huge.cview(), o,
                 "decode_attention: the output overflowed float32 although q and the cache are finite");
  }
  // Every score below -FLT_MAX (q = -1e20 against keys of 1e20, finite): the rows came out 0 as if
  // masked, where the float64 reference gives the mean of v. Sequence 1 sees no key (length 0) and
  // stays 0, so only a row with allowed keys is refused.
  KVCache ones({4, 4, 1, 2, 2, KVDtype::f32});
  const std::vector<int64_t> two{ones.create(), ones.create()};
  Tensor<float> k_big({3, 1, 2}), v_one({3, 1, 2});
  for (int64_t e = 0; e < 6; ++e) k_big[e] = 1e20f, v_one[e] = 1.0f;
  ones.append(two[0], k_big.cview(), v_one.cview());
  Tensor<float> q_neg({2, 1, 1, 2}), out2({2, 1, 1, 2});
  for (int64_t e = 0; e < 4; ++e) q_neg[e] = -1e20f;
  for (int threads : {1, 2}) {
    o = {};
    o.attention.num_threads = threads;
    test::expect_error([&] { decode_attention(out2.view(), TensorView<float>(), q_neg.cview(), ones, two, o); },
                       {"decode_attention: the output overflowed float32 although q and the cache are finite"});
  }
  const std::vector<int64_t> empty_only{two[1]};
  Tensor<float> q1({1, 1, 1, 2}), out1({1, 1, 1, 2});
  q1[0] = q1[1] = -1e20f;
  decode_attention(out1.view(), TensorView<float>(), q1.cview(), ones, empty_only, {});
  EXPECT_EQ(out1[0], 0.0f);
  EXPECT_EQ(out1[1], 0.0f);
  // A scale fp32 cannot hold is the caller's error, named as such (it was blamed on q and the cache).
  o = {};
  o.attention.scale = 1e300;
  expect_error(good, q.cview(), o, "decode_attention: scale must be finite and at most FLT_MAX (3.4e38)");
}

// Outputs the decode functions write while they still read their inputs: each must have places
// of its own (an out over lse took three values of lse, one over the bias called masked rows an
// overflow), a null data pointer is named rather than read, and the weights' lse must be [B, H, N]
// (a [1, 1, 1] lse was read past its end).
TEST(Decode, RefusesOutputsOverTheirInputsNullDataAndAMisshapenLse) {
  test::Rng rng("Decode.Outputs");
  const Filled f = small_cache(rng, 2, 2, 8, 10);
  const PagedKV kv = f.cache.paged(f.ids);
  Tensor<float> q = rng.normal32({1, 4, 1, 8}), out({1, 4, 1, 8}), lse({1, 4, 1}), big({64});
  Tensor<float> bias({1, 4, 1, 10}), weights({1, 4, 1, 10}), values({1, 4, 1, 3});
  Tensor<int64_t> indices({1, 4, 1, 3});
  const std::array<int64_t, 4> shape{1, 4, 1, 8}, shared{0, 0, 0, 1};
  auto decode = [&](TensorView<float> o, TensorView<float> l, TensorView<const float> qv, const DecodeOptions& opt) {
    decode_attention(o, l, qv, kv, opt);
  };
  using test::expect_error;
  expect_error(
      [&] {
        decode(TensorView<float>(big.data(), shape), TensorView<float>(big.data() + 30, {1, 4, 1}), q.cview(), {});
      },
      {"decode_attention: lse: shares memory with out"});
  expect_error([&] { decode(TensorView<float>(out.data(), shape, shared), {}, q.cview(), {}); },
               {"decode_attention: out: its strides make elements share memory"});
  expect_error([&] { decode(q.view(), {}, q.cview(), {}); }, {"decode_attention: out: shares memory with q"});
  DecodeOptions masked;
  masked.attention.mask.bias = bias.cview();
  expect_error([&] { decode(TensorView<float>(bias.data(), shape), {}, q.cview(), masked); },
               {"decode_attention: out: shares memory with the bias"});
  float* pool = static_cast<float*>(const_cast<void*>(kv.k));
  expect_error([&] { decode(TensorView<float>(pool, shape), {}, q.cview(), {}); },
               {"decode_attention: out: shares memory with the cache's key pool"});
  expect_error([&] { decode(out.view(), {}, TensorView<const float>(nullptr, shape), {}); },
               {"q: a null data pointer for shape [1, 4, 1, 8]"});
  expect_error([&] { decode(TensorView<float>(nullptr, shape), {}, q.cview(), {}); },
               {"decode_attention: out: a null data pointer"});
  expect_error(
      [&] {
        decode_attention_weights(TensorView<float>(q.data(), {1, 4, 1, 2}), q.cview(), kv, {});
      },
      {"output has shape [1, 4, 1, 2], expected [1, 4, 1, 10]"});
  expect_error(
      [&] {
        decode_attention_weights(TensorView<float>(big.data(), {1, 4, 1, 10}),
                                 TensorView<const float>(big.data(), shape), kv, {});
      },
      {"decode_attention_weights: weights: shares memory with q"});
  expect_error(
      [&] {
        decode_attention_top_k(TensorView<float>(reinterpret_cast<float*>(indices.data()), {1, 4, 1, 3}),
                               indices.view(), q.cview(), kv, {}, 3);
      },
      {"decode_attention_top_k: indices: shares memory with decode_attention_top_k: values"});
  const Tensor<float> small_lse({1, 1, 1});
  expect_error([&] { decode_attention_weights(weights.view(), q.cview(), kv, small_lse.cview()); },
               {"decode_attention_weights: lse: shape [1, 1, 1] must be [1, 4, 1]"});
  expect_error([&] { decode_attention_top_k(values.view(), indices.view(), q.cview(), kv, small_lse.cview(), 3); },
               {"decode_attention_top_k: lse: shape [1, 1, 1] must be [1, 4, 1]"});
  // No input explains a NaN or +inf lse here: decode_attention refuses a non-finite q or bias, and
  // the cache holds finite values.
  Tensor<float> bad_lse({1, 4, 1});
  bad_lse.view()(0, 2, 0) = std::numeric_limits<float>::quiet_NaN();
  const std::string impossible =
      " although q and the cache are finite; no forward gives that (a row's lse is finite, or -inf when the row has "
      "no allowed key): pass the lse that decode_attention returned for this q and cache, or no lse to recompute it";
  expect_error([&] { decode_attention_weights(weights.view(), q.cview(), kv, bad_lse.cview()); },
               {"decode_attention_weights: lse[0, 2, 0] is NaN" + impossible});
  bad_lse.view()(0, 2, 0) = std::numeric_limits<float>::infinity();
  expect_error([&] { decode_attention_top_k(values.view(), indices.view(), q.cview(), kv, bad_lse.cview(), 3); },
               {"decode_attention_top_k: lse[0, 2, 0] is +inf" + impossible});
  // Separate buffers pass, the forward's lse among them.
  decode(out.view(), lse.view(), q.cview(), {});
  decode_attention_weights(weights.view(), q.cview(), kv, lse.cview());
  decode_attention_top_k(values.view(), indices.view(), q.cview(), kv, lse.cview(), 3);
}

// A hand-made PagedKV whose size products wrap int64 (B · max_blocks = 4 · 2^62 wrapped to 0, the
// empty table's size, and the kernel read block_table[0]), an integer cast to KVDtype (its
// outputs silently 0) and a q with a negative dimension are refused by name, by decode_attention
// and by the weight functions that run its checks.
TEST(Decode, RefusesWrappingSizesUnknownDtypesAndNegativeDims) {
  test::Rng rng("Decode.Hostile");
  const Filled f = small_cache(rng, 1, 1, 4, 6);
  const PagedKV good = f.cache.paged(f.ids);
  const Tensor<float> q = rng.normal32({1, 1, 1, 4});
  Tensor<float> out({1, 1, 1, 4}), weights({1, 1, 1, 6}), values({1, 1, 1, 2});
  Tensor<int64_t> indices({1, 1, 1, 2});
  auto expect_all = [&](const PagedKV& kv, TensorView<const float> qv, const std::string& text) {
    test::expect_error([&] { decode_attention(out.view(), TensorView<float>(), qv, kv); }, {text});
    if (qv.rank() == 4 && qv.dim(2) >= 0) {  // a q of the right shape: the outputs match it
      test::expect_error([&] { decode_attention_weights(weights.view(), qv, kv, {}); }, {text});
      test::expect_error([&] { decode_attention_top_k(values.view(), indices.view(), qv, kv, {}, 2); }, {text});
    }
  };
  std::vector<float> pool(4 * 4 * 4, 1.0f), q4(4 * 4, 0.5f), out4(4 * 4);
  PagedKV wraps;
  wraps.num_pages = 4, wraps.page_tokens = 1, wraps.Hkv = 1, wraps.D = 4, wraps.Dv = 4;
  wraps.k = pool.data(), wraps.v = pool.data();
  wraps.seq_lens = {1, 1, 1, 1};
  wraps.max_blocks = int64_t{1} << 62;
  test::expect_error(
      [&] {
        decode_attention(TensorView<float>(out4.data(), {4, 1, 1, 4}), TensorView<float>(),
                         TensorView<const float>(q4.data(), {4, 1, 1, 4}), wraps);
      },
      {"decode_attention: block_table: shape [4, 4611686018427387904] is too large to address"});
  PagedKV bad = good;
  bad.num_pages = int64_t{1} << 40, bad.page_tokens = int64_t{1} << 20;
  expect_all(bad, q.cview(),
             "decode_attention: the cache's key pool: shape [1099511627776, 1, 1048576, 4] is too large");
  // No sequence (B = 0) leaves max_blocks free, but not its product with page_tokens.
  bad = good;
  bad.seq_lens.clear(), bad.block_table.clear();
  bad.max_blocks = int64_t{1} << 40, bad.page_tokens = int64_t{1} << 30;
  bad.num_pages = 1;
  const Tensor<float> q0({0, 1, 1, 4});
  Tensor<float> out0({0, 1, 1, 4});
  test::expect_error([&] { decode_attention(out0.view(), TensorView<float>(), q0.cview(), bad); },
                     {"decode_attention: max_blocks · page_tokens: shape [1099511627776, 1073741824] is too large"});
  bad = good;
  bad.dtype = static_cast<KVDtype>(4);
  expect_all(bad, q.cview(), "decode_attention: dtype = 4 is not a KVDtype (f32, bf16, f16 or i8)");
  expect_all(good, TensorView<const float>(q.data(), {1, 1, -1, 4}),
             "decode_attention: q: negative dimension in shape [1, 1, -1, 4]");
  test::expect_error(
      [&] {
        decode_attention_weights(TensorView<float>(weights.data(), {1, 1, -1, 6}),
                                 TensorView<const float>(q.data(), {1, 1, -1, 4}), good, {});
      },
      {"decode_attention_weights: q: negative dimension in shape [1, 1, -1, 4]"});
}

}  // namespace
}  // namespace qkv
