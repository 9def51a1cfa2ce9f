#include "qkv/options_parse.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "qkv/error.h"

namespace qkv {

CausalAlign parse_causal_align(std::string_view text) {
  if (text == "top_left") return CausalAlign::top_left;
  if (text == "bottom_right") return CausalAlign::bottom_right;
  throw Error(fmt::format("causal_align must be 'top_left' or 'bottom_right', got '{}'", text));
}

float softcap_value(double cap) {
  const float f = static_cast<float>(cap);
  if (!(cap >= 0.0) || !std::isfinite(f))
    throw Error(fmt::format("softcap must be a finite number >= 0 (0 = off), got {}", cap));
  if (cap > 0.0 && !(f >= std::numeric_limits<float>::min()))
    throw Error(fmt::format("softcap = {} is below float32's normal range; pass 0 to turn the cap off", cap));
  return f;
}

float alibi_slope_value(double slope, std::size_t index) {
  const float f = static_cast<float>(slope);
  if (!std::isfinite(f))
    throw Error(
        fmt::format("alibi_slopes[{}] = {} must be finite and at most FLT_MAX (3.4e38) in magnitude (kept as float32)",
                    index, slope));
  return f;
}

void check_alibi_count(std::size_t count, int64_t H) {
  if (static_cast<int64_t>(count) != H)
    throw Error(fmt::format("alibi_slopes: expected {} entries (one per query head), got {}", H, count));
}

void check_lengths(std::span<const int64_t> lengths, int64_t B, int64_t limit, std::string_view name) {
  if (static_cast<int64_t>(lengths.size()) != B)
    throw Error(fmt::format("{}: expected {} entries (one per batch row), got {}", name, B, lengths.size()));
  for (std::size_t b = 0; b < lengths.size(); ++b)
    if (lengths[b] < 0 || lengths[b] > limit)
      throw Error(fmt::format("{}[{}] = {} is outside [0, {}]", name, b, lengths[b], limit));
}

double dropout_p_value(double p) {
  if (!(p >= 0.0 && p < 1.0)) throw Error(fmt::format("dropout_p must be in [0, 1), got {}", p));
  return p;
}

}  // namespace qkv
