// The KV codec (core/kv_codec.h): names, sizes, encoding and limits of every storage type.
#include "qkv/kv_dtype.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include <fmt/format.h>

#include "core/kv_codec.h"
#include "qkv/error.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

constexpr KVDtype kAll[] = {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8};

// numpy's name of each type, accepted beside the canonical one.
const char* numpy_name(KVDtype dtype) {
  switch (dtype) {
    case KVDtype::f32:
      return "float32";
    case KVDtype::bf16:
      return "bfloat16";
    case KVDtype::f16:
      return "float16";
    case KVDtype::i8:
      return "int8";
  }
  return "unknown";
}

}  // namespace

const char* kv_dtype_name(KVDtype dtype) {
  switch (dtype) {
    case KVDtype::f32:
      return "f32";
    case KVDtype::bf16:
      return "bf16";
    case KVDtype::f16:
      return "f16";
    case KVDtype::i8:
      return "i8";
  }
  return "unknown";
}

KVDtype parse_kv_dtype(std::string_view text, std::string_view what) {
  for (KVDtype d : kAll)
    if (text == kv_dtype_name(d) || text == numpy_name(d)) return d;
  throw Error(fmt::format("{} must be 'f32', 'bf16', 'f16' or 'i8', got '{}'", what, text));
}

void require_kv_dtype(KVDtype dtype, std::string_view who) {
  if (std::ranges::find(kAll, dtype) == std::end(kAll))
    throw Error(fmt::format("{}: dtype = {} is not a KVDtype (f32, bf16, f16 or i8)", who, static_cast<int>(dtype)));
}

int64_t kv_dtype_bytes(KVDtype dtype) {
  switch (dtype) {
    case KVDtype::f32:
      return 4;
    case KVDtype::bf16:
    case KVDtype::f16:
      return 2;
    case KVDtype::i8:
      return 1;
  }
  // A size of 0 would divide by zero in the size checks of whoever asked.
  require_kv_dtype(dtype, "kv_dtype_bytes");
  return 0;
}

bool kv_dtype_scaled(KVDtype dtype) { return dtype == KVDtype::i8; }

namespace detail {

// The largest float s with 127·s <= amax, so every |x| <= amax is within s/2 <= amax/254 (half
// the step max|x| / 127) of a level q·s, |q| <= 127, and 127·s never overflows. Below FLT_MIN·127
// the scale is a subnormal, a multiple of 2^-149: rounding down then costs up to 2^-149 of it,
// which is still within the step's half while amax >= 127·255·2^-149 (4.5e-41). Below that no
// float scale keeps the bound (amax = 200·2^-149 needs a step of exactly 200/127 · 2^-149), and
// the next float up is taken: every value is within s/2, at most half a step plus 2^-150.
float kv_int8_scale(float amax) {
  const double limit = amax;  // 127·s and 127.5·s below are exact in double
  float s = static_cast<float>(limit / 127.0);
  if (127.0 * s > limit) s = std::nextafter(s, 0.0f);
  if (127.5 * s < limit) s = std::nextafter(s, std::numeric_limits<float>::infinity());
  return s;
}

void kv_encode_row(KVDtype dtype, const float* x, int64_t sx, int64_t n, void* dst, float* scale) {
  switch (dtype) {
    case KVDtype::f32: {
      auto* d = static_cast<float*>(dst);
      for (int64_t e = 0; e < n; ++e) d[e] = x[e * sx];
      return;
    }
    case KVDtype::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t e = 0; e < n; ++e) d[e] = float_to_bf16(x[e * sx]).bits;
      return;
    }
    case KVDtype::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t e = 0; e < n; ++e) d[e] = float_to_half(x[e * sx]);
      return;
    }
    case KVDtype::i8: {
      auto* d = static_cast<int8_t*>(dst);
      float amax = 0.0f;
      for (int64_t e = 0; e < n; ++e) amax = std::max(amax, std::fabs(x[e * sx]));
      const float s = kv_int8_scale(amax);
      *scale = s;
      // q = round(x / s) in double (exact enough: the quotient of two floats): the nearest of the
      // 255 levels, so |q·s - x| <= s/2. (127 / amax in float overflowed for amax < 3.7e-37 and
      // turned every nonzero value into ±127, and a zero into 0 · inf = NaN.)
      for (int64_t e = 0; e < n; ++e) {
        const double q = s > 0.0f ? std::nearbyint(static_cast<double>(x[e * sx]) / s) : 0.0;
        d[e] = static_cast<int8_t>(std::clamp(q, -127.0, 127.0));
      }
      return;
    }
  }
}

bool kv_storable(KVDtype dtype, float value) {
  if (dtype == KVDtype::f16) return std::fabs(value) < kHalfOverflow;
  if (dtype == KVDtype::bf16) return std::isfinite(bf16_to_float(float_to_bf16(value)));
  return true;
}

}  // namespace detail
}  // namespace qkv
