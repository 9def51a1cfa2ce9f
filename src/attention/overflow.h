// The one rule for a result past the arithmetic's range from finite inputs (q scaled by 1e20, v
// near the type's maximum, q = 1e20 against k = -1e20): refused with qkv::Error, not returned as
// inf, NaN or a row of zeros. Non-finite inputs, or a bias with NaN or +inf, are the caller's own
// and give what any composite in that precision gives. Used by the fp32 forward and backward
// (fused and reference kernels) and the float64 reference forward and backward.
#pragma once

#include <cmath>
#include <limits>
#include <string>

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

// Whether the inputs explain a non-finite result themselves: a NaN or inf in q, k or v, or a NaN
// or +inf in the bias.
template <class T>
bool inputs_explain_overflow(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, const Mask& mask) {
  return !all_finite(q) || !all_finite(k) || !all_finite(v) ||
         (!mask.bias.empty() && find_non_finite(mask.bias, true).has_value());
}

// A forward's lse is finite, or -inf for a row with no allowed key (read as a fully masked row).
// NaN or +inf comes from no forward of finite inputs and would pass into every weight or gradient
// of its row without a word, so whatever reads a caller's lse refuses one (refuse_impossible_lse)
// unless the inputs are non-finite themselves (inputs_explain_overflow): then it is the forward's.
inline bool impossible_lse(double x) { return std::isnan(x) || x == std::numeric_limits<double>::infinity(); }

// Throws for a caller's lse at `row` (as the caller indexes it) holding `value` (impossible_lse),
// read by `who` from a forward of `inputs`; `remedy` says which lse to pass instead.
[[noreturn]] inline void refuse_impossible_lse(const char* who, const std::string& row, double value,
                                               const char* inputs, const char* remedy) {
  throw Error(fmt::format(
      "{}: {} is {} although {} are finite; no forward gives that (a row's lse is finite, or -inf when the row has "
      "no allowed key): {}",
      who, row, std::isnan(value) ? "NaN" : "+inf", inputs, remedy));
}

// What a caller of an fp32 kernel can do about an overflow: the float64 reference computes the
// scores and sums in double and rounds only the results.
inline constexpr const char* kFp32OverflowRemedy =
    "scale the inputs down or use the float64 reference kernel (Kernel::reference; kernel=\"reference\" in Python)";

// Who a caller of an fp32 kernel called, and what it can do about an overflow, where that is not
// attention_forward's or attention_backward's: varlen names itself, and Python's varlen takes no
// kernel choice.
struct Caller {
  const char* who = nullptr;     // null: the function's own name
  const char* remedy = nullptr;  // null: kFp32OverflowRemedy
};

// The varlen functions' Caller.
inline constexpr const char* kVarlenOverflowRemedy =
    "scale the inputs down (the float64 reference kernel is Kernel::reference in C++; Python's varlen has no "
    "kernel choice)";

// Ring attention's Caller remedy: its Python functions take no kernel choice.
inline constexpr const char* kRingOverflowRemedy =
    "scale the inputs down (the float64 reference kernel is Kernel::reference in C++ and --kernel reference in the "
    "CLI; Python's ring_attention has no kernel choice)";

// Which result overflowed, and in what arithmetic, for the message of refuse_overflow.
struct Overflow {
  const char* who;                             // the function the caller called ("attention_forward")
  const char* type;                            // the arithmetic ("float32")
  const char* limit;                           // its largest value ("3.4e38")
  const char* remedy;                          // what the caller can do
  const char* inputs = "q, k and v";           // the inputs whose finiteness makes it an overflow
  const char* results = "scores or P·V sums";  // what went past the limit
};

// The fp32 kernels' Overflow for a call of `own` (attention_forward, attention_backward) made as
// `caller`.
inline Overflow fp32_overflow(const char* own, const Caller& caller) {
  return {caller.who != nullptr ? caller.who : own, "float32", "3.4e38",
          caller.remedy != nullptr ? caller.remedy : kFp32OverflowRemedy};
}

// Call when a row with an allowed key came out non-finite (or with every logit -inf:
// MaskEval::row_has_allowed_key), or when a gradient did: throws unless the inputs explain it. A backward passes its
// dout (its message then names the gradients) and, in `explained`, whether its other inputs (the
// forward's out and lse) hold what explains a non-finite gradient. `suspect`, if given, runs when
// nothing explains it, before the arithmetic is blamed: it throws naming another culprit (an lse
// that is not the forward's) if it finds one.
template <class T, class Suspect = void (*)()>
void refuse_overflow(
    const Overflow& o, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, const Mask& mask,
    const TensorView<const T>* dout = nullptr, bool explained = false, Suspect suspect = [] {}) {
  if (explained || inputs_explain_overflow(q, k, v, mask) || (dout != nullptr && !all_finite(*dout))) return;
  suspect();
  if (dout == nullptr)
    throw Error(fmt::format("{}: the output overflowed {} although {} are finite ({} beyond {}); {}", o.who, o.type,
                            o.inputs, o.results, o.limit, o.remedy));
  throw Error(
      fmt::format("{}: the gradients overflowed {} although q, k, v and dout are finite (scores, dout·v or "
                  "gradient sums beyond {}); {}",
                  o.who, o.type, o.limit, o.remedy));
}

}  // namespace qkv::detail
