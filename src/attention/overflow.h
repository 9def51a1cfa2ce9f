// The one rule for a result past the arithmetic's range from finite inputs (q scaled by 1e20, v
// near the type's maximum, q = 1e20 against k = -1e20): refused with qkv::Error, not returned as
// inf, NaN or a row of zeros. Non-finite inputs, or a bias with NaN or +inf, are the caller's own
// and give what any composite in that precision gives. Used by the fused forward (float32) and the
// float64 reference forward and backward.
#pragma once

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "qkv/attention_options.h"
#include "qkv/error.h"
#include "qkv/tensor.h"

namespace qkv::detail {

template <class T>
bool all_finite(TensorView<const T> t) {
  bool finite = true;
  for_each_element(t, [&](const T& x, const auto&) { finite = finite && std::isfinite(element_cast<double>(x)); });
  return finite;
}

// A keep-mask, or a bias with a -inf, can take every key of a row away (every score -inf); a row
// emptied otherwise had its allowed scores overflow to -inf.
inline bool may_mask_whole_rows(const Mask& mask) {
  if (!mask.keep.empty()) return true;
  bool minus_inf = false;
  if (!mask.bias.empty())
    for_each_element(mask.bias, [&](const float& x, const auto&) {
      minus_inf = minus_inf || x == -std::numeric_limits<float>::infinity();
    });
  return minus_inf;
}

// Whether the inputs explain a non-finite result themselves: a NaN or inf in q, k or v, or a NaN
// or +inf in the bias.
template <class T>
bool inputs_explain_overflow(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, const Mask& mask) {
  if (!all_finite(q) || !all_finite(k) || !all_finite(v)) return true;
  bool bias_ok = true;
  if (!mask.bias.empty())
    for_each_element(mask.bias, [&](const float& x, const auto&) {
      bias_ok = bias_ok && !std::isnan(x) && x != std::numeric_limits<float>::infinity();
    });
  return !bias_ok;
}

// Call when a row with an allowed key came out non-finite (or emptied where no mask could have
// emptied it): throws unless the inputs explain it. `type` names the arithmetic ("float32"),
// `limit` its largest value, `remedy` what the caller can do.
template <class T>
void refuse_overflow(const char* who, const char* type, const char* limit, const char* remedy, TensorView<const T> q,
                     TensorView<const T> k, TensorView<const T> v, const Mask& mask) {
  if (inputs_explain_overflow(q, k, v, mask)) return;
  throw Error(
      fmt::format("{}: the output overflowed {} although q, k and v are finite (scores or P·V sums beyond {}); "
                  "{}",
                  who, type, limit, remedy));
}

// The same rule for a backward: call when a gradient came out non-finite (or a row was emptied as
// above); throws unless the inputs, dout included, explain it.
template <class T>
void refuse_gradient_overflow(const char* who, const char* type, const char* limit, const char* remedy,
                              TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                              TensorView<const T> dout, const Mask& mask) {
  if (inputs_explain_overflow(q, k, v, mask) || !all_finite(dout)) return;
  throw Error(
      fmt::format("{}: the gradients overflowed {} although q, k, v and dout are finite (scores, dout·v or "
                  "gradient sums beyond {}); {}",
                  who, type, limit, remedy));
}

}  // namespace qkv::detail
