// KVCache: what is stored is what was appended (to the storage dtype's rounding), forks share
// pages and copy only a shared partial last page, freed pages return, every refusal is clean
// (nothing half-appended), and the pool is the only allocation that grows with tokens.
#include <malloc.h>

#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/kv_cache.h"
#include "kv_storage_error.h"
#include "sanitizers.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::storage_error;

KVCacheConfig config(KVDtype dtype, int64_t pages = 8, int64_t page_tokens = 4, int64_t Hkv = 2, int64_t D = 5,
                     int64_t Dv = 3) {
  return KVCacheConfig{pages, page_tokens, Hkv, D, Dv, dtype};
}

// Checks that `stored` [Hkv, T, E] holds `x` [T, Hkv, E] (appended rows) within storage error.
void expect_stored(KVDtype dtype, const Tensor<float>& stored, const Tensor<float>& x) {
  const int64_t T = x.dim(0), Hkv = x.dim(1), E = x.dim(2);
  ASSERT_EQ(stored.dim(1), T);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hkv; ++h) {
      double amax = 0;
      for (int64_t e = 0; e < E; ++e) amax = std::max<double>(amax, std::fabs(x[(t * Hkv + h) * E + e]));
      for (int64_t e = 0; e < E; ++e) {
        const double want = x[(t * Hkv + h) * E + e], got = stored[(h * T + t) * E + e];
        ASSERT_LE(std::fabs(got - want), storage_error(dtype, want, amax))
            << kv_dtype_name(dtype) << " t " << t << " h " << h << " e " << e << ": " << got << " vs " << want;
      }
    }
}

TEST(KVCache, StoresAppendedTokensAcrossPagesForEveryDtype) {
  test::Rng rng("KVCache.Stores");
  for (KVDtype dtype : {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8}) {
    KVCache cache(config(dtype));
    const int64_t a = cache.create(), b = cache.create();
    Tensor<float> ka = rng.normal32({11, 2, 5}), va = rng.normal32({11, 2, 3});
    Tensor<float> kb = rng.normal32({6, 2, 5}), vb = rng.normal32({6, 2, 3});
    ka[7] = 1e-6f;  // a subnormal in fp16
    // Interleaved appends of two sequences, so their pages interleave in the pool.
    cache.append(a, TensorView<const float>(ka.data(), {3, 2, 5}), TensorView<const float>(va.data(), {3, 2, 3}));
    cache.append(b, kb.cview(), vb.cview());
    cache.append(a, TensorView<const float>(ka.data() + 30, {8, 2, 5}),
                 TensorView<const float>(va.data() + 18, {8, 2, 3}));
    EXPECT_EQ(cache.length(a), 11);
    EXPECT_EQ(cache.pages(a).size(), 3u);
    EXPECT_EQ(cache.free_pages(), 8 - 3 - 2);
    expect_stored(dtype, cache.keys(a), ka);
    expect_stored(dtype, cache.values(a), va);
    expect_stored(dtype, cache.keys(b), kb);
    expect_stored(dtype, cache.values(b), vb);
  }
}

TEST(KVCache, AppendsAViewOfItsOwnPoolAsItWasWhenTheCallBegan) {
  // A page's four slots appended to the sequence that owns it, whose length ends after slot 0: each
  // token was read from the slot the token before it had just overwritten. (The freed sequence
  // filled the pages first, so no slot read is unwritten memory.)
  KVCache cache(config(KVDtype::f32, 2, 4, 1, 3, 3));
  test::Rng rng("KVCache.AppendsAViewOfItsOwnPool");
  const int64_t filler = cache.create();
  const Tensor<float> full = rng.normal32({8, 1, 3}), one = rng.normal32({1, 1, 3});
  cache.append(filler, full.cview(), full.cview());
  cache.free(filler);
  const int64_t a = cache.create();
  cache.append(a, one.cview(), one.cview());
  const int64_t page = cache.pages(a)[0];
  const std::array<int64_t, 3> shape{4, 1, 3}, strides{3, 12, 1};
  const TensorView<const float> k(static_cast<const float*>(cache.k_pool()) + page * 12, shape, strides);
  const TensorView<const float> v(static_cast<const float*>(cache.v_pool()) + page * 12, shape, strides);
  const Tensor<float> k_then = to_contiguous<float>(k), v_then = to_contiguous<float>(v);
  cache.append(a, k, v);
  ASSERT_EQ(cache.length(a), 5);
  const Tensor<float> keys = cache.keys(a), values = cache.values(a);
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t e = 0; e < 3; ++e) {
      EXPECT_EQ(keys[(1 + t) * 3 + e], k_then[t * 3 + e]) << "token " << 1 + t << " e " << e;
      EXPECT_EQ(values[(1 + t) * 3 + e], v_then[t * 3 + e]) << "token " << 1 + t << " e " << e;
    }
}

TEST(KVCache, Fp16RoundsToNearestEven) {
  KVCache cache(config(KVDtype::f16, 1, 1, 1, 6, 1));
  const int64_t s = cache.create();
  const float tie_down = 1.0f + std::ldexp(1.0f, -11), tie_up = 1.0f + 3 * std::ldexp(1.0f, -11);
  const float k[6] = {tie_down, tie_up, 65504.0f, -std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), 0.1f};
  const float v[1] = {0};
  cache.append(s, TensorView<const float>(k, {1, 1, 6}), TensorView<const float>(v, {1, 1, 1}));
  const Tensor<float> got = cache.keys(s);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(got[2], 65504.0f);
  EXPECT_EQ(got[3], -std::ldexp(1.0f, -24));
  EXPECT_EQ(got[4], 0.0f);  // a tie between 0 and the smallest subnormal goes to even (0)
  EXPECT_EQ(got[5], 0.0999755859375f);
}

// The largest floats: int8's scale amax / 127 rounded up once made 127 · scale infinite, so
// FLT_MAX came back as inf; bf16 keeps its largest finite value.
TEST(KVCache, HoldsTheLargestFiniteValues) {
  const float big = std::numeric_limits<float>::max();
  const float k[4] = {big, -big, 1.0f, 3.3e38f};
  const float v[1] = {0};
  for (KVDtype dtype : {KVDtype::f32, KVDtype::bf16, KVDtype::i8}) {
    KVCache cache(config(dtype, 1, 1, 1, 4, 1));
    const int64_t s = cache.create();
    const float* kk = dtype == KVDtype::bf16 ? k + 2 : k;  // bf16 rounds FLT_MAX itself to inf (refused)
    const int64_t n = dtype == KVDtype::bf16 ? 2 : 4;
    Tensor<float> row({1, 1, 4});
    for (int64_t e = 0; e < 4; ++e) row[e] = e < n ? kk[e] : 0.0f;
    cache.append(s, row.cview(), TensorView<const float>(v, {1, 1, 1}));
    const Tensor<float> got = cache.keys(s);
    for (int64_t e = 0; e < 4; ++e) {
      EXPECT_TRUE(std::isfinite(got[e])) << kv_dtype_name(dtype) << " e " << e << ": " << got[e];
      EXPECT_LE(std::fabs(double(got[e]) - double(row[e])), storage_error(dtype, row[e], big))
          << kv_dtype_name(dtype) << " e " << e;
    }
  }
}

// int8 at the ends of float's range, against the bound of kv_dtype.h: every stored value within
// half a step (max|x| / 254) of x, plus only the float rounding of q · scale. 127 / max|x| in
// float overflowed for max|x| < 3.7e-37, so every nonzero value came back as ±max|x| (x = 0.3 of
// the maximum: off by 0.7 of it) for all-subnormal tokens, a maximum of FLT_MIN or 1e-37; and a
// subnormal scale max|x| / 127 rounded to the nearest multiple of 2^-149 can miss the bound by
// up to 64 of them. Below max|x| = 127·255·2^-149 no float scale keeps the bound and 2^-150 more
// is allowed. Each token holds its maximum, its negative, 0, values just below a level's half
// (where a scale a little too large tips the rounding) and random ones.
TEST(KVCache, Int8KeepsHalfAStepForSubnormalTinyAndHugeTokens) {
  test::Rng rng("KVCache.Int8Extremes");
  const float sub = std::numeric_limits<float>::denorm_min();  // 2^-149
  const float kept = 127.0f * 255.0f * sub;                    // the smallest maximum that keeps the bound
  const float maxima[] = {1e-40f,
                          std::numeric_limits<float>::min(),  // the smallest normal
                          std::nextafter(std::numeric_limits<float>::min(), 0.0f),
                          1e-37f,
                          3e-39f,
                          kept,
                          std::nextafter(kept, 0.0f),
                          200 * sub,
                          127 * sub,
                          sub,
                          1.0f,
                          3.3e38f,
                          std::numeric_limits<float>::max()};
  constexpr int64_t D = 48;
  for (const float amax : maxima) {
    SCOPED_TRACE(::testing::Message() << "max|x| " << amax);
    Tensor<float> x({1, 2, D});  // two heads: the keys' row and a permuted copy
    for (int64_t e = 0; e < D; ++e) {
      double value;
      if (e < 3)
        value = e == 0 ? amax : e == 1 ? -amax : 0.0;
      else if (e < 24)
        value = (static_cast<double>(e % 127) + 0.4999) / 127.0 * amax * (e % 2 ? -1 : 1);
      else
        value = rng.uniform(-1.0, 1.0) * amax;
      x[e] = static_cast<float>(value);
      x[D + (e * 7) % D] = x[e];
    }
    for (int64_t e = 0; e < 2 * D; ++e) ASSERT_LE(std::fabs(x[e]), amax);
    KVCache cache(config(KVDtype::i8, 1, 1, 2, D, D));
    const int64_t s = cache.create();
    cache.append(s, x.cview(), x.cview());
    const double extra = amax < kept ? std::ldexp(1.0, -150) : 0.0;
    for (const Tensor<float>& got : {cache.keys(s), cache.values(s)}) {
      for (int64_t e = 0; e < 2 * D; ++e) {
        const double err = std::fabs(static_cast<double>(got[e]) - x[e]);
        // got is float(q) · scale rounded to float: exact below FLT_MIN, half an ulp above.
        const double bound = static_cast<double>(amax) / 254.0 + extra + std::fabs(got[e]) * std::ldexp(1.0, -24);
        ASSERT_LE(err, bound) << "element " << e << ": stored " << got[e] << " for " << x[e] << ", scale "
                              << cache.k_scales()[e / D];
      }
    }
    for (int h = 0; h < 2; ++h) {
      const float scale = cache.k_scales()[h];
      EXPECT_TRUE(std::isfinite(127.0f * scale)) << scale;
      if (amax >= kept) {
        EXPECT_LE(127.0 * scale, amax) << "the scale is max|x| / 127 rounded down";
      }
    }
  }
}

TEST(KVCache, ForkSharesPagesAndCopiesOnlyASharedPartialLastPage) {
  test::Rng rng("KVCache.Fork");
  KVCache cache(config(KVDtype::f32));
  const int64_t parent = cache.create();
  Tensor<float> k = rng.normal32({6, 2, 5}), v = rng.normal32({6, 2, 3});
  cache.append(parent, k.cview(), v.cview());  // pages: one full, one with 2 of 4 tokens
  const int64_t child = cache.fork(parent);
  EXPECT_EQ(cache.free_pages(), 6);
  const std::vector<int32_t> shared(cache.pages(parent).begin(), cache.pages(parent).end());
  for (int32_t p : shared) EXPECT_EQ(cache.page_refcount(p), 2);
  Tensor<float> k2 = rng.normal32({1, 2, 5}), v2 = rng.normal32({1, 2, 3});
  cache.append(child, k2.cview(), v2.cview());
  EXPECT_EQ(cache.free_pages(), 5);  // the partial page was copied, nothing else
  EXPECT_EQ(cache.pages(child)[0], shared[0]);
  EXPECT_NE(cache.pages(child)[1], shared[1]);
  EXPECT_EQ(cache.page_refcount(shared[0]), 2);
  EXPECT_EQ(cache.page_refcount(shared[1]), 1);
  expect_stored(KVDtype::f32, cache.keys(parent), k);  // the parent is untouched
  EXPECT_EQ(cache.length(parent), 6);
  EXPECT_EQ(cache.length(child), 7);
  const Tensor<float> ck = cache.keys(child);
  for (int64_t e = 0; e < 5; ++e) EXPECT_EQ(ck[(0 * 7 + 6) * 5 + e], k2[e]);
  // A fork whose last page is full shares everything and copies nothing on append.
  cache.append(parent, TensorView<const float>(k.data(), {2, 2, 5}), TensorView<const float>(v.data(), {2, 2, 3}));
  const int64_t full = cache.fork(parent);
  const int64_t before = cache.free_pages();
  cache.append(full, k2.cview(), v2.cview());
  EXPECT_EQ(cache.free_pages(), before - 1);
  EXPECT_EQ(cache.pages(full)[1], cache.pages(parent)[1]);
  // Freeing returns only the pages nobody else holds.
  cache.free(parent);
  cache.free(full);
  EXPECT_EQ(cache.free_pages(), 8 - 2);  // child keeps shared[0] and its copy
  cache.free(child);
  EXPECT_EQ(cache.free_pages(), 8);
}

// What a cache shared by Python threads rests on (python/cache.cpp): a decode reads a PagedKV taken
// under the caller's lock (the GIL) and runs without it, while other threads create, append to,
// fork and free other sequences under that lock, reusing pages all the time. Nothing they write
// may be a page the decode reads: under TSan (thread_tests.filter) that would be a reported race,
// and here every decode must be bitwise the first.
TEST(KVCacheThreads, DecodeBesideAppendForkAndFreeOfOtherSequences) {
  test::Rng rng("KVCacheThreads.Decode");
  KVCache cache(config(KVDtype::f16, 96, 16, 2, 32, 32));
  std::mutex lock;  // the GIL's part
  const int64_t shared = cache.create();
  const Tensor<float> k = rng.normal32({200, 2, 32}), v = rng.normal32({200, 2, 32});
  cache.append(shared, k.cview(), v.cview());  // the last page partly filled: forks copy it
  const Tensor<float> q = rng.normal32({1, 4, 1, 32});
  DecodeOptions options;
  options.attention.mask.causal = CausalAlign::bottom_right;
  options.attention.num_threads = 1;
  auto decode = [&](Tensor<float>& out) {
    Tensor<float> lse({1, 4, 1});
    PagedKV kv;
    {
      const std::lock_guard hold(lock);
      kv = cache.paged(std::array<int64_t, 1>{shared});
    }
    decode_attention(out.view(), lse.view(), q.cview(), kv, options);
  };
  Tensor<float> expected({1, 4, 1, 32});
  decode(expected);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> changes{0};
  auto writer = [&](uint64_t seed) {
    std::mt19937_64 r(seed);
    std::vector<int64_t> mine;
    std::vector<float> kv(16 * 2 * 32, 0.25f);
    while (!stop.load()) {
      const std::lock_guard hold(lock);
      if (mine.size() < 3 || (mine.size() < 6 && r() % 2 == 0)) {  // at most 12 of the 96 pages each
        const int64_t seq = r() % 3 == 0 ? cache.fork(shared) : cache.create();
        const int64_t T = 1 + static_cast<int64_t>(r() % 16);
        cache.append(seq, TensorView<const float>(kv.data(), {T, 2, 32}),
                     TensorView<const float>(kv.data(), {T, 2, 32}));
        mine.push_back(seq);
      } else {
        cache.free(mine.back());
        mine.pop_back();
      }
      ++changes;
    }
    const std::lock_guard hold(lock);
    for (const int64_t seq : mine) cache.free(seq);
  };
  std::thread a(writer, rng.engine()()), b(writer, rng.engine()());
  int differ = 0, decodes = 0;
  for (; decodes < 400 || changes.load() < 400; ++decodes) {
    Tensor<float> out({1, 4, 1, 32});
    decode(out);
    differ += std::memcmp(out.data(), expected.data(), sizeof(float) * 128) != 0;
    if (decodes > 100000) break;
  }
  stop = true;
  a.join();
  b.join();
  EXPECT_EQ(differ, 0) << "of " << decodes << " decodes beside " << changes.load() << " changes";
  EXPECT_GE(changes.load(), 400);
  EXPECT_EQ(cache.free_pages(), 96 - static_cast<int64_t>(cache.pages(shared).size()));
}

TEST(KVCache, RefusesBadUseAndLeavesNothingHalfAppended) {
  test::Rng rng("KVCache.Errors");
  KVCache cache(config(KVDtype::i8, 2));
  const int64_t s = cache.create();
  Tensor<float> k = rng.normal32({5, 2, 5}), v = rng.normal32({5, 2, 3});
  cache.append(s, TensorView<const float>(k.data(), {3, 2, 5}), TensorView<const float>(v.data(), {3, 2, 3}));
  const Tensor<float> before = cache.keys(s);
  using test::expect_error;
  Tensor<float> big_k = rng.normal32({6, 2, 5}), big_v = rng.normal32({6, 2, 3});
  expect_error([&] { cache.append(s, big_k.cview(), big_v.cview()); },
               {"6 tokens need 2 free pages, the pool of 2 has 1 left"});
  expect_error([&] { cache.append(42, k.cview(), v.cview()); }, {"unknown sequence id 42"});
  expect_error([&] { cache.fork(42); }, {"unknown sequence id 42"});
  expect_error([&] { cache.free(42); }, {"unknown sequence id 42"});
  expect_error([&] { cache.length(-1); }, {"unknown sequence id -1"});
  Tensor<float> k_wrong = rng.normal32({1, 2, 4});
  expect_error(
      [&] {
        cache.append(s, k_wrong.cview(), TensorView<const float>(v.data(), {1, 2, 3}));
      },
      {"k has shape [1, 2, 4], expected [T, Hkv = 2, D = 5]"});
  expect_error(
      [&] {
        cache.append(s, TensorView<const float>(k.data(), {1, 2, 5}), TensorView<const float>(v.data(), {1, 1, 3}));
      },
      {"v has shape [1, 1, 3], expected [T = 1, Hkv = 2, Dv = 3]"});
  Tensor<float> k_nan = rng.normal32({2, 2, 5});
  k_nan[13] = std::nanf("");
  expect_error(
      [&] {
        cache.append(s, k_nan.cview(), TensorView<const float>(v.data(), {2, 2, 3}));
      },
      {"k[1, 0, 3] = nan: the cache holds finite values only"});
  KVCache half(config(KVDtype::f16));
  const int64_t hs = half.create();
  Tensor<float> k_big = rng.normal32({1, 2, 5});
  k_big[2] = 70000.0f;
  expect_error(
      [&] {
        half.append(hs, k_big.cview(), TensorView<const float>(v.data(), {1, 2, 3}));
      },
      {"k[0, 0, 2] = 70000 cannot be stored as f16"});
  EXPECT_EQ(half.length(hs), 0);
  // bf16 rounds 3.4e38 to infinity: refused like f16's overflow (it was stored as inf, and decode
  // then treated every key as masked).
  KVCache brain(config(KVDtype::bf16));
  const int64_t bs = brain.create();
  k_big[2] = 3.4e38f;
  expect_error(
      [&] {
        brain.append(bs, k_big.cview(), TensorView<const float>(v.data(), {1, 2, 3}));
      },
      {"k[0, 0, 2] = 3.4e+38 cannot be stored as bf16"});
  EXPECT_EQ(brain.length(bs), 0);
  // After every refusal the sequence is as it was.
  EXPECT_EQ(cache.length(s), 3);
  EXPECT_EQ(cache.free_pages(), 1);
  const Tensor<float> after = cache.keys(s);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), sizeof(float) * before.numel()), 0);
  expect_error([] { KVCache bad(config(KVDtype::f32, 0)); }, {"must be positive"});
}

// A negative token count (it set the length below 0, and the next append wrote before the pool),
// a count only a stride-0 view can describe, an integer cast to KVDtype (a division by its size
// of 0) and a page outside the pool (read out of bounds) are refused, and the cache stays as it was.
TEST(KVCache, RefusesNegativeDimsUnknownDtypesAndPagesOutsideThePool) {
  test::Rng rng("KVCache.Hostile");
  KVCache cache(config(KVDtype::f32));
  const int64_t s = cache.create();
  const Tensor<float> k = rng.normal32({2, 2, 5}), v = rng.normal32({2, 2, 3});
  cache.append(s, k.cview(), v.cview());
  const Tensor<float> before = cache.keys(s);
  const int64_t free_before = cache.free_pages();
  using test::expect_error;
  const RotaryOptions rope;
  for (const RotaryOptions* rotary : {static_cast<const RotaryOptions*>(nullptr), &rope}) {
    expect_error(
        [&] {
          cache.append(s, TensorView<const float>(k.data(), {-5, 2, 5}), TensorView<const float>(v.data(), {-5, 2, 3}),
                       rotary);
        },
        {"KVCache::append: k: negative dimension in shape [-5, 2, 5]"});
    const std::array<int64_t, 3> huge_k{int64_t{1} << 40, 2, 5}, huge_v{int64_t{1} << 40, 2, 3}, k_strides{0, 5, 1},
        v_strides{0, 3, 1};
    expect_error(
        [&] {
          cache.append(s, TensorView<const float>(k.data(), huge_k, k_strides),
                       TensorView<const float>(v.data(), huge_v, v_strides), rotary);
        },
        {"KVCache::append: 1099511627776 tokens exceed the pool's 32 token slots (8 pages of 4)"});
  }
  EXPECT_EQ(cache.length(s), 2);
  EXPECT_EQ(cache.free_pages(), free_before);
  const Tensor<float> after = cache.keys(s);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), sizeof(float) * before.numel()), 0);
  cache.append(s, TensorView<const float>(k.data(), {1, 2, 5}), TensorView<const float>(v.data(), {1, 2, 3}));
  EXPECT_EQ(cache.length(s), 3);

  const auto unknown = static_cast<KVDtype>(4);
  expect_error([&] { KVCache bad(config(unknown)); }, {"KVCache: dtype = 4 is not a KVDtype (f32, bf16, f16 or i8)"});
  expect_error([&] { kv_dtype_bytes(static_cast<KVDtype>(-1)); },
               {"kv_dtype_bytes: dtype = -1 is not a KVDtype (f32, bf16, f16 or i8)"});
  for (KVDtype d : {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8}) EXPECT_NO_THROW(require_kv_dtype(d, "x"));
  // An element size of 0 bounds the count alone (it divided by zero).
  const std::array<int64_t, 2> small{2, 3}, past{int64_t{1} << 40, int64_t{1} << 30}, negative{2, -3};
  EXPECT_EQ(checked_numel(small, 0, "x"), 6);
  expect_error([&] { checked_numel(past, 0, "x"); }, {"x: shape [1099511627776, 1073741824] is too large to address"});
  expect_error([&] { checked_numel(negative, 0, "x"); }, {"x: negative dimension in shape [2, -3]"});

  EXPECT_EQ(cache.page_refcount(cache.pages(s)[0]), 1);
  EXPECT_EQ(cache.page_refcount(7), 0);
  for (int64_t page : {int64_t{-1}, int64_t{8}, int64_t{1} << 32})
    expect_error([&] { cache.page_refcount(page); },
                 {"KVCache::page_refcount: page " + std::to_string(page) + " is outside the pool of 8 pages"});
}

long vm_size_kb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stol(line.substr(7));
  return -1;
}

// The pool is allocated once, at creation, and is all that grows with the token capacity: the
// address space grows by the pool (large pools are mapped directly, in whole 2 MB huge pages; the
// sizes here are multiples of 2 MB) and the heap by bookkeeping only.
TEST(KVCache, AllocatesExactlyItsPool) {
#ifdef QKV_TEST_UNDER_TSAN
  // TSan's runtime maps memory for its own bookkeeping as the program runs (an append grew the
  // address space by 512 KB there), so the process's size no longer measures the cache's; the
  // plain and ASan builds run it.
  GTEST_SKIP() << "the address space is TSan's to grow under ThreadSanitizer";
#endif
  for (KVDtype dtype : {KVDtype::f32, KVDtype::i8}) {
    const KVCacheConfig c = config(dtype, 256, 64, 4, 128, 128);
    const long vm0 = vm_size_kb();
    const struct mallinfo2 m0 = mallinfo2();
    KVCache cache(c);
    const struct mallinfo2 m1 = mallinfo2();
    const long vm1 = vm_size_kb();
    const int64_t slots = 256 * 4 * 64;
    const int64_t expect = slots * 256 * kv_dtype_bytes(dtype) + (dtype == KVDtype::i8 ? slots * 8 : 0);
    EXPECT_EQ(cache.pool_bytes(), expect);
    const int64_t small_pools = dtype == KVDtype::i8 ? slots * 8 : 0;  // the scales (< 2 MB) are malloc'd
    EXPECT_GE(vm1 - vm0, (expect - small_pools) / 1024);
    // When malloc serves the scales from its heap (glibc raises its mmap threshold once a mapped
    // block is freed), the heap grows by them plus up to M_TOP_PAD (128 KB) less the free space it
    // had: 588 KB for 512 KB of scales after KVCache.Int8KeepsHalfAStep..., 568 KB without it.
    const int64_t top_pad = dtype == KVDtype::i8 ? 128 : 0;
    EXPECT_LE(vm1 - vm0, expect / 1024 + 64 + top_pad) << "address space beyond the pool";
    const int64_t heap = static_cast<int64_t>((m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd));
    EXPECT_LE(heap, small_pools + 256 * 8 + 4 * 4096) << "bookkeeping beyond the pool";
    // Appending allocates no pages: only the sequence's block table grows.
    const int64_t s = cache.create();
    Tensor<float> k({64 * 10, 4, 128}), v({64 * 10, 4, 128});
    const struct mallinfo2 m2 = mallinfo2();
    const long vm2 = vm_size_kb();
    cache.append(s, k.cview(), v.cview());
    const struct mallinfo2 m3 = mallinfo2();
    EXPECT_LE(static_cast<int64_t>((m3.uordblks + m3.hblkhd) - (m2.uordblks + m2.hblkhd)), 1024);
    EXPECT_EQ(vm_size_kb(), vm2);
  }
}

// The sizes `qkv bench` and the decode benchmarks take from the cache: the pool in whole pages
// with the page bookkeeping, and what one decode step reads, its page table included.
TEST(KVCache, SizesFollowOneRule) {
  using test::expect_error;
  for (KVDtype dtype : {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8}) {
    const KVCacheConfig c = config(dtype, 8, 16, 2, 4, 8);
    // A token: 2 heads x (4 + 8 elements, and i8's 2 fp32 scales).
    const int64_t token = 2 * (12 * kv_dtype_bytes(dtype) + (dtype == KVDtype::i8 ? 8 : 0));
    EXPECT_EQ(KVCache(c).pool_bytes(), 8 * 16 * token);
    EXPECT_EQ(kv_cache_bytes(c), 8.0 * 16 * token + 8 * 8);  // an int32 reference count and free slot a page
    // 116 tokens read, not the 12 unused slots of the first sequence's last page; 7 + 1 + 0
    // block-table entries and 3 lengths.
    const std::array<int64_t, 3> lens{100, 16, 0};
    EXPECT_EQ(decode_step_bytes(c, lens), 116.0 * token + 8 * 4 + 3 * 8);
  }
  // Pages of one token read an int32 of table per token.
  const std::array<int64_t, 1> one{1000};
  EXPECT_EQ(decode_step_bytes(config(KVDtype::i8, 1, 1, 1, 1, 1), one) -
                decode_step_bytes(config(KVDtype::i8, 1, 1000, 1, 1, 1), one),
            999.0 * 4);
  // Past int64, still a size to report.
  EXPECT_GT(kv_cache_bytes(config(KVDtype::f32, int64_t{1} << 48, 1, int64_t{1} << 24, int64_t{1} << 24)), 9.0e18);
  expect_error([&] { decode_step_bytes(config(KVDtype::f16, 1, 0), one); },
               {"decode_step_bytes: page_tokens = 0 is not positive"});
  const std::array<int64_t, 1> negative{-1};
  expect_error([&] { decode_step_bytes(config(KVDtype::f16), negative); },
               {"decode_step_bytes: a sequence of -1 tokens"});
  expect_error([&] { kv_cache_bytes(config(static_cast<KVDtype>(4))); },
               {"kv_dtype_bytes: dtype = 4 is not a KVDtype (f32, bf16, f16 or i8)"});
}

}  // namespace
}  // namespace qkv
