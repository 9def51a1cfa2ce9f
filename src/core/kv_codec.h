// Internal: the KV codec, the scalar truth of every storage type (qkv/kv_dtype.h): how a float
// is encoded, how a stored element is decoded, and what a type can hold. The cache encodes with
// it; the decode kernel's tails, the float64 weights path and the scalar family decode with it.
// The SIMD decode bodies keep their vector conversions and must agree with decode_unscaled bit
// for bit (tests/kv_codec_test.cpp checks every f16 and bf16 pattern and every int8 value).
// A new storage type is added here, in kv_dtype.cpp, and in each family's widening load.
#pragma once

#include <bit>
#include <cstdint>

#include "core/half.h"
#include "qkv/kv_dtype.h"

namespace qkv::detail {

inline float bf16_bits_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// Element e of a stored row as fp32; int8 as the stored integer, unscaled (the decode kernel
// applies the scale once per key instead of per element).
inline float kv_decode_unscaled(KVDtype dtype, const void* row, int64_t e) {
  switch (dtype) {
    case KVDtype::f32:
      return static_cast<const float*>(row)[e];
    case KVDtype::bf16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(row)[e]);
    case KVDtype::f16:
      return half_to_float(static_cast<const uint16_t*>(row)[e]);
    case KVDtype::i8:
      return static_cast<float>(static_cast<const int8_t*>(row)[e]);
  }
  return 0.0f;
}

// The value element e of a stored row stands for: int8 times its row's scale (ignored otherwise).
inline float kv_decode(KVDtype dtype, const void* row, int64_t e, float scale) {
  const float x = kv_decode_unscaled(dtype, row, e);
  return dtype == KVDtype::i8 ? x * scale : x;
}

// Writes one token's head vector x[0, n) (stride sx) at dst in the storage type, rounding to
// nearest; int8 also writes its scale (kv_int8_scale of the vector's largest magnitude). Every
// value must be kv_storable.
void kv_encode_row(KVDtype dtype, const float* x, int64_t sx, int64_t n, void* dst, float* scale);

// The int8 scale of a vector whose largest magnitude is amax (kv_dtype.h states the bound).
float kv_int8_scale(float amax);

// Whether a finite value stays finite once stored: bf16 and f16 round to infinity near their
// limits; f32 and int8 (whose scale is finite) hold every finite value.
bool kv_storable(KVDtype dtype, float value);

}  // namespace qkv::detail
