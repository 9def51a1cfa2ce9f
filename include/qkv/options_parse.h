// The rules for the mask and dropout options users type, below every front end: the CLI, the
// numpy and torch bindings and both rings convert their arguments to these plain values and call
// these functions, so one option gets one rule and one message wherever it is given. Each throws
// qkv::Error (ValueError in Python) whose text starts with the option's Python name; the CLI's
// usage errors print it after the flag ("--softcap: softcap = 1e-50 is below ...").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "qkv/mask.h"

namespace qkv {

// "top_left" or "bottom_right" (causal_align; the CLI's --causal=ALIGN and --diagonal).
// Throws "causal_align must be 'top_left' or 'bottom_right', got '<text>'".
CausalAlign parse_causal_align(std::string_view text);

// A softcap as the kernels keep it (float32): finite, >= 0, and 0 only when 0 was asked for. A cap
// below float32's normal range is refused rather than rounded to 0, which would turn it off.
float softcap_value(double cap);

// ALiBi slope `index` as float32: finite and at most FLT_MAX in magnitude (1e300 would reach the
// kernels as inf).
float alibi_slope_value(double slope, std::size_t index);

// One slope per query head: throws "alibi_slopes: expected <H> entries (one per query head), got <n>".
void check_alibi_count(std::size_t count, int64_t H);

// Per-batch-row lengths (key_lengths, query_lengths): B entries, each in [0, limit].
void check_lengths(std::span<const int64_t> lengths, int64_t B, int64_t limit, std::string_view name);

// dropout_p in [0, 1) (a NaN refused): throws "dropout_p must be in [0, 1), got <p>".
double dropout_p_value(double p);

}  // namespace qkv
