// Internal: IEEE binary16 <-> float32, the one copy of the format's arithmetic: the f16 KV storage
// type (core/kv_codec.h) and the .npy and .safetensors readers use it.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace qkv::detail {

// Exact: every binary16 value is a float.
inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // Subnormal (or zero): mantissa * 2^-24, exact in float.
    float v = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// The smallest magnitude that rounds to infinity in binary16 (65504 plus half its last step).
constexpr float kHalfOverflow = 65520.0f;

// Round to nearest even. Only for finite |f| < kHalfOverflow: callers refuse the rest (the
// exponent field would overflow into the sign).
inline uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
  if (absx < 0x38800000u) {  // below 2^-14: a subnormal half, m · 2^-24 (the product is exact)
    const float m = std::nearbyint(std::bit_cast<float>(absx) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(m));  // m = 1024 is the smallest normal
  }
  uint32_t h = ((absx >> 23) - 112) << 10 | (absx & 0x7fffffu) >> 13;
  const uint32_t rest = absx & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

}  // namespace qkv::detail
