// decode_attention under keep-masks and -inf biases that hide whole key chunks, or every key, of a
// row: the result attention_forward and the float64 reference give (a row with no key is 0 with
// lse -inf), bitwise the same for 1, 2 and 3 threads; decode_attention_top_k counts allowed keys
// as attention_weights_topk does, whatever their weight.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "attention_cases.h"
#include "decode_cases.h"
#include "qkv/kv_cache.h"
#include "qkv/reference.h"
#include "qkv/weights.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::Case;
using test::fill;
using test::Filled;
using test::max_abs;
using test::max_diff;
using test::Result;
using test::run_decode;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Which keys row (b, h, i) keeps, for each pattern of the test below. Sequence 0 has 2048 keys in
// four chunks of 512 (decode.cpp's plan), sequence 1 1100 keys in three.
using Pattern = std::function<bool(int64_t b, int64_t h, int64_t i, int64_t j)>;

struct Named {
  const char* name;
  Pattern keeps;
};

const std::vector<Named>& patterns() {
  static const std::vector<Named> all{
      {"hidden prefix (the first two chunks)", [](int64_t, int64_t, int64_t, int64_t j) { return j >= 1024; }},
      {"hidden middle chunk", [](int64_t, int64_t, int64_t, int64_t j) { return j < 512 || j >= 1024; }},
      {"every key hidden", [](int64_t, int64_t, int64_t, int64_t) { return false; }},
      // Per row: nothing, one chunk's worth past sequence 1's end (nothing there), one key, all.
      {"rows hidden in part or whole",
       [](int64_t, int64_t h, int64_t i, int64_t j) {
         switch ((h * 2 + i) % 4) {
           case 0:
             return false;
           case 1:
             return j >= 1536 && j < 1600;
           case 2:
             return j == 7;
           default:
             return true;
         }
       }},
  };
  return all;
}

// The float64 reference of each sequence on its stored keys and values, with the mask's slice.
void reference_rows(const Case& c, const Filled& f, const Tensor<float>& q, TensorView<const uint8_t> keep,
                    TensorView<const float> bias, Tensor<double>& out, Tensor<double>& lse) {
  const int64_t H = c.Hkv * c.G, M = keep.empty() ? bias.dim(3) : keep.dim(3);
  for (std::size_t b = 0; b < c.lens.size(); ++b) {
    const int64_t len = c.lens[b];
    const Tensor<float> k32 = f.cache.keys(f.ids[b]), v32 = f.cache.values(f.ids[b]);
    Tensor<double> qd({1, H, c.N, c.D}), kd({1, c.Hkv, len, c.D}), vd({1, c.Hkv, len, c.Dv});
    for (int64_t e = 0; e < qd.numel(); ++e) qd[e] = q[static_cast<int64_t>(b) * qd.numel() + e];
    for (int64_t e = 0; e < kd.numel(); ++e) kd[e] = k32[e];
    for (int64_t e = 0; e < vd.numel(); ++e) vd[e] = v32[e];
    const std::array<int64_t, 4> shape{1, H, c.N, len}, strides{H * c.N * M, c.N * M, M, 1};
    AttentionOptions o;
    const int64_t at = static_cast<int64_t>(b) * H * c.N * M;
    if (!keep.empty()) o.mask.keep = TensorView<const uint8_t>(keep.data() + at, shape, strides);
    if (!bias.empty()) o.mask.bias = TensorView<const float>(bias.data() + at, shape, strides);
    TensorView<double> ob(out.data() + static_cast<int64_t>(b) * H * c.N * c.Dv, {1, H, c.N, c.Dv});
    TensorView<double> lb(lse.data() + static_cast<int64_t>(b) * H * c.N, {1, H, c.N});
    reference_attention_forward(ob, lb, TensorView<double>(), qd.cview(), kd.cview(), vd.cview(), o);
  }
}

// Keys a keep-mask or a -inf bias hides from a row, whole chunks of them or all: the decode took
// a chunk where a row kept no key for an fp32 overflow and refused the call ("the output
// overflowed float32 although q and the cache are finite").
TEST(DecodeMask, HiddenChunksAndRowsGiveTheReferenceResult) {
  test::Rng rng("DecodeMask.HiddenChunks");
  for (KVDtype dtype : {KVDtype::f32, KVDtype::f16}) {
    Case c;
    c.dtype = dtype, c.Hkv = 2, c.G = 2, c.N = 2, c.D = 16, c.Dv = 8, c.page_tokens = 64;
    c.lens = {2048, 1100};
    const int64_t B = 2, H = 4, M = 2048;
    const Filled f = fill(rng, c);
    const Tensor<float> q = rng.normal32({B, H, c.N, c.D});
    for (const Named& pattern : patterns())
      for (bool as_bias : {false, true}) {
        Tensor<uint8_t> keep({B, H, c.N, M});
        Tensor<float> bias({B, H, c.N, M});
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < c.N; ++i)
              for (int64_t j = 0; j < M; ++j) {
                const int64_t at = ((b * H + h) * c.N + i) * M + j;
                const bool kept = pattern.keeps(b, h, i, j);
                keep[at] = kept ? 1 : 0;
                bias[at] = kept ? static_cast<float>(rng.uniform(-1, 1)) : kNegInf;
              }
        Case cm = c;
        if (as_bias)
          cm.options.attention.mask.bias = bias.cview();
        else
          cm.options.attention.mask.keep = keep.cview();
        const std::string what =
            std::string(pattern.name) + (as_bias ? ", -inf bias, " : ", keep-mask, ") + kv_dtype_name(dtype);
        Tensor<double> ref({B, H, c.N, c.Dv}), ref_lse({B, H, c.N});
        reference_rows(c, f, q, as_bias ? TensorView<const uint8_t>() : keep.cview(),
                       as_bias ? bias.cview() : TensorView<const float>(), ref, ref_lse);
        for (Simd simd : test::available_paths()) {
          const Result one = run_decode(cm, f, q, simd, 1);
          EXPECT_LE(max_diff(one.out, ref), 2e-5 * (1 + max_abs(ref))) << what << " " << simd_path_name(simd);
          EXPECT_LE(max_diff(one.lse, ref_lse), 2e-5 * (1 + max_abs(ref_lse))) << what;
          for (int64_t r = 0; r < ref_lse.numel(); ++r) {  // a row with no key: exactly 0 and -inf
            if (ref_lse[r] != -INFINITY) continue;
            for (int64_t e = 0; e < c.Dv; ++e) EXPECT_EQ(one.out[r * c.Dv + e], 0.0f) << what << " row " << r;
          }
          for (int threads : {2, 3}) {
            const Result r = run_decode(cm, f, q, simd, threads);
            EXPECT_EQ(std::memcmp(one.out.data(), r.out.data(), sizeof(float) * r.out.numel()), 0)
                << what << " " << simd_path_name(simd) << " threads " << threads;
            EXPECT_EQ(std::memcmp(one.lse.data(), r.lse.data(), sizeof(float) * r.lse.numel()), 0) << what;
          }
        }
      }
  }
}

// Scores below -FLT_MAX from finite inputs (q = -1e20 against keys of 1e20): a chunk of them
// beside finite scores elsewhere in the row gives attention_forward's result (they weigh 0); a
// row whose every kept key scores there is refused, with or without a mask, since the mask kept
// those keys; a mask that removes the finite ones leaves exactly such a row.
TEST(DecodeMask, ScoresBelowFloat32AreRefusedOnlyWhereTheMaskKeepsThem) {
  KVCache cache({8, 256, 1, 2, 2, KVDtype::f32});
  const std::vector<int64_t> ids{cache.create()};
  Tensor<float> k({1024, 1, 2}), v({1024, 1, 2});
  for (int64_t t = 0; t < 1024; ++t)
    for (int64_t e = 0; e < 2; ++e) {
      k[t * 2 + e] = t < 512 ? 1e20f : 1e-3f * static_cast<float>(t % 7);
      v[t * 2 + e] = static_cast<float>(t % 5);
    }
  cache.append(ids[0], k.cview(), v.cview());
  Tensor<float> q({1, 1, 1, 2}), out({1, 1, 1, 2}), lse({1, 1, 1}), fwd({1, 1, 1, 2}), fwd_lse({1, 1, 1});
  q[0] = q[1] = -1e20f;
  // Chunk 0's scores are -inf, chunk 1's finite: the forward gives chunk 1's softmax.
  for (int threads : {1, 2}) {
    DecodeOptions o;
    o.attention.num_threads = threads;
    decode_attention(out.view(), lse.view(), q.cview(), cache, ids, o);
    attention_forward(fwd.view(), fwd_lse.view(), q.cview(), TensorView<const float>(k.data(), {1, 1, 1024, 2}),
                      TensorView<const float>(v.data(), {1, 1, 1024, 2}));
    EXPECT_NEAR(out[0], fwd[0], 1e-5);
    EXPECT_NEAR(out[1], fwd[1], 1e-5);
    EXPECT_FLOAT_EQ(lse[0], fwd_lse[0]);
  }
  const std::string overflow = "decode_attention: the output overflowed float32 although q and the cache are finite";
  DecodeOptions o;
  Tensor<uint8_t> keep({1, 1, 1, 1024});
  for (int64_t j = 0; j < 1024; ++j) keep[j] = j < 512;
  Tensor<float> bias({1, 1, 1, 1024});
  for (int64_t j = 0; j < 1024; ++j) bias[j] = j < 512 ? 0.0f : kNegInf;
  for (int masked = 0; masked < 2; ++masked) {
    o.attention.mask.keep = masked == 0 ? keep.cview() : TensorView<const uint8_t>();
    o.attention.mask.bias = masked == 1 ? bias.cview() : TensorView<const float>();
    test::expect_error([&] { decode_attention(out.view(), lse.view(), q.cview(), cache, ids, o); }, {overflow});
  }
  const std::vector<int64_t> one_chunk{cache.create()};
  cache.append(one_chunk[0], TensorView<const float>(k.data(), {512, 1, 2}),
               TensorView<const float>(v.data(), {512, 1, 2}));
  test::expect_error([&] { decode_attention(out.view(), lse.view(), q.cview(), cache, one_chunk); }, {overflow});
  // The same keys, every one removed by the mask: a masked row, not an overflow.
  std::fill(keep.data(), keep.data() + keep.numel(), uint8_t{0});
  o = {};
  o.attention.mask.keep = TensorView<const uint8_t>(keep.data(), {1, 1, 1, 512});
  decode_attention(out.view(), lse.view(), q.cview(), cache, one_chunk, o);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(lse[0], kNegInf);
}

// An allowed key whose weight underflows to 0 keeps its index, as attention_weights_topk gives it;
// -1 only past the keys the band, the keep-mask and a -inf bias allow (it was -1 for the
// underflowed key too).
TEST(DecodeMask, TopKCountsAnUnderflowedWeightAsAllowed) {
  KVCache cache({1, 4, 1, 1, 1, KVDtype::f32});
  const std::vector<int64_t> ids{cache.create()};
  const std::vector<float> k{0.0f, -1000.0f, 5.0f, 1.0f}, v{1, 2, 3, 4}, q{1.0f};
  cache.append(ids[0], TensorView<const float>(k.data(), {4, 1, 1}), TensorView<const float>(v.data(), {4, 1, 1}));
  const std::vector<uint8_t> keep{1, 1, 0, 1};
  const std::vector<float> bias{0.0f, 0.0f, 0.0f, kNegInf};
  const TensorView<const float> qv(q.data(), {1, 1, 1, 1});
  const std::vector<int64_t> rows{0};
  for (int variant = 0; variant < 3; ++variant) {
    DecodeOptions o;
    o.attention.scale = 1.0;  // scores 0, -1000, 5, 1: weight e^-1000 of key 1 underflows to 0
    if (variant >= 1) o.attention.mask.keep = TensorView<const uint8_t>(keep.data(), {1, 1, 1, 4});
    if (variant == 2) o.attention.mask.bias = TensorView<const float>(bias.data(), {1, 1, 1, 4});
    std::vector<float> values(4), want_values(4);
    std::vector<int64_t> indices(4), want_indices(4);
    decode_attention_top_k(TensorView<float>(values.data(), {1, 1, 1, 4}),
                           TensorView<int64_t>(indices.data(), {1, 1, 1, 4}), qv, cache.paged(ids), {}, 4, o);
    attention_weights_topk(TensorView<float>(want_values.data(), {1, 1, 1, 4}),
                           TensorView<int64_t>(want_indices.data(), {1, 1, 1, 4}), qv,
                           TensorView<const float>(k.data(), {1, 1, 4, 1}), {}, rows, 4, o.attention);
    const std::vector<std::vector<int64_t>> expected{{2, 3, 0, 1}, {3, 0, 1, -1}, {0, 1, -1, -1}};
    EXPECT_EQ(indices, expected[variant]) << "variant " << variant;
    EXPECT_EQ(indices, want_indices) << "variant " << variant;
    for (int t = 0; t < 4; ++t) EXPECT_NEAR(values[t], want_values[t], 1e-6) << "variant " << variant << " " << t;
  }
}

// A NaN or +inf in the bias makes the row NaN: decode names the bias element (it was reported as
// an fp32 overflow "although q and the cache are finite"), on every cache type and thread count.
TEST(DecodeMask, ANaNOrInfiniteBiasIsNamed) {
  for (KVDtype dtype : {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8}) {
    KVCache cache({1, 8, 1, 2, 2, dtype});
    const std::vector<int64_t> ids{cache.create()};
    const std::vector<float> k{0.5f, 1, 2, 0, 1, 1, 0, 2}, v{1, 2, 3, 4, 5, 6, 7, 8}, q{1.0f, 0.5f};
    cache.append(ids[0], TensorView<const float>(k.data(), {4, 1, 2}), TensorView<const float>(v.data(), {4, 1, 2}));
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
      for (int threads : {1, 2}) {
        std::vector<float> bias{0.0f, -1.0f, bad, 0.25f}, out(2), lse(1);
        DecodeOptions o;
        o.attention.num_threads = threads;
        o.attention.mask.bias = TensorView<const float>(bias.data(), {1, 1, 1, 4});
        test::expect_error(
            [&] {
              decode_attention(TensorView<float>(out.data(), {1, 1, 1, 2}), TensorView<float>(lse.data(), {1, 1, 1}),
                               TensorView<const float>(q.data(), {1, 1, 1, 2}), cache, ids, o);
            },
            {fmt::format("decode_attention: bias[0, 0, 0, 2] = {} must be a number below +inf (-inf masks)", bad)});
      }
  }
}

}  // namespace
}  // namespace qkv
