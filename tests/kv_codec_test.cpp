// The KV codec (core/kv_codec.h) is the scalar truth of every storage type: each SIMD family's
// widening loads must decode every stored pattern to the same bits, and the encoder must invert
// the decoder wherever a value is storable.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/kv_codec.h"
#include "kernels/decode.h"
#include "kernels/dispatch.h"
#include "qkv/error.h"
#include "qkv/kv_dtype.h"

namespace qkv {
namespace {

using WidenFn = void (*)(KVDtype, const void*, int64_t, float*);

std::vector<std::pair<std::string, WidenFn>> families() {
  std::vector<std::pair<std::string, WidenFn>> out{{"scalar", kernels::decode_widen_scalar}};
#if defined(__x86_64__)
  if (kernels::cpu_features().avx2_fma) out.emplace_back("avx2", kernels::decode_widen_avx2);
  if (kernels::cpu_features().avx512) out.emplace_back("avx512", kernels::decode_widen_avx512);
#elif defined(__aarch64__)
  out.emplace_back("neon", kernels::decode_widen_neon);
#endif
  return out;
}

// NaN patterns need only stay NaN: hardware conversions quieten a signalling NaN, the codec keeps it.
void expect_same(const std::vector<float>& got, KVDtype dtype, const void* src, const std::string& family) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float want = detail::kv_decode_unscaled(dtype, src, static_cast<int64_t>(i));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << family << " " << kv_dtype_name(dtype) << " pattern " << i;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want))
          << family << " " << kv_dtype_name(dtype) << " pattern " << i;
    }
  }
}

TEST(KVCodec, EveryFamilyDecodesEverySixteenBitPatternAsTheCodec) {
  std::vector<uint16_t> bits(65536);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i);
  for (const auto& [name, widen] : families())
    for (KVDtype dtype : {KVDtype::f16, KVDtype::bf16}) {
      std::vector<float> got(bits.size());
      widen(dtype, bits.data(), static_cast<int64_t>(bits.size()), got.data());
      expect_same(got, dtype, bits.data(), name);
    }
}

TEST(KVCodec, EveryFamilyDecodesEveryInt8AsTheCodec) {
  std::vector<int8_t> values(256);
  for (int i = 0; i < 256; ++i) values[static_cast<std::size_t>(i)] = static_cast<int8_t>(i - 128);
  for (const auto& [name, widen] : families()) {
    std::vector<float> got(values.size());
    widen(KVDtype::i8, values.data(), static_cast<int64_t>(values.size()), got.data());
    expect_same(got, KVDtype::i8, values.data(), name);
    for (int i = 0; i < 256; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], static_cast<float>(i - 128));
  }
}

// Every finite f16 and bf16 value survives an encode: decode(encode(decode(bits))) == decode(bits).
TEST(KVCodec, EncodeInvertsDecodeOnEveryFiniteSixteenBitValue) {
  for (KVDtype dtype : {KVDtype::f16, KVDtype::bf16})
    for (uint32_t i = 0; i < 65536; ++i) {
      // Room for a float: the decoder's f32 case, never taken here, reads 4 bytes.
      alignas(4) const uint16_t bits[2] = {static_cast<uint16_t>(i), 0};
      const float x = detail::kv_decode_unscaled(dtype, bits, 0);
      if (!std::isfinite(x)) continue;
      ASSERT_TRUE(detail::kv_storable(dtype, x)) << kv_dtype_name(dtype) << " " << x;
      uint16_t back = 0;
      detail::kv_encode_row(dtype, &x, 1, 1, &back, nullptr);
      EXPECT_EQ(back, bits[0]) << kv_dtype_name(dtype) << " " << x;
    }
}

TEST(KVCodec, LimitsOfEachType) {
  EXPECT_TRUE(detail::kv_storable(KVDtype::f16, 65519.0f));
  EXPECT_FALSE(detail::kv_storable(KVDtype::f16, 65520.0f));
  EXPECT_TRUE(detail::kv_storable(KVDtype::bf16, 3.3895e38f));
  EXPECT_FALSE(detail::kv_storable(KVDtype::bf16, 3.4e38f));
  EXPECT_TRUE(detail::kv_storable(KVDtype::f32, 3.4e38f));
  EXPECT_TRUE(detail::kv_storable(KVDtype::i8, 3.4e38f));
  // int8: q · scale with |q| <= 127, the scale's bound of kv_dtype.h.
  const float x[3] = {1.0f, -2.5f, 127.0f};
  int8_t q[3];
  float scale = 0.0f;
  detail::kv_encode_row(KVDtype::i8, x, 1, 3, q, &scale);
  EXPECT_EQ(scale, 1.0f);
  for (int e = 0; e < 3; ++e) EXPECT_LE(std::fabs(detail::kv_decode(KVDtype::i8, q, e, scale) - x[e]), scale / 2);
}

TEST(KVCodec, NamesRoundTripAndOneMessageForTheRest) {
  for (KVDtype d : {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8})
    EXPECT_EQ(parse_kv_dtype(kv_dtype_name(d)), d);
  EXPECT_EQ(parse_kv_dtype("float16"), KVDtype::f16);
  EXPECT_EQ(parse_kv_dtype("int8"), KVDtype::i8);
  try {
    parse_kv_dtype("fp8", "--kv-dtype");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--kv-dtype must be 'f32', 'bf16', 'f16' or 'i8', got 'fp8'");
  }
}

}  // namespace
}  // namespace qkv
