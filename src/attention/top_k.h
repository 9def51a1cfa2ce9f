// The one top-k rule of qkv's weight tools (attention_weights_topk, attention_top_k,
// decode_attention_top_k and the Python bindings over them): what k may be, and the order of
// the keys kept.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "qkv/error.h"

namespace qkv::detail {

// Throws qkv::Error "<caller>: top_k must be at least 1, got <k>" unless k >= 1.
inline void require_top_k(int64_t k, std::string_view caller) {
  if (k < 1) throw Error(fmt::format("{}: top_k must be at least 1, got {}", caller, k));
}

// Puts the n keys of `keys` with the largest w[key] first, largest first, ties to the lower key
// (so the order does not depend on how the candidates were listed); the rest stay after them.
inline void order_top_k(std::vector<int64_t>& keys, int64_t n, const std::vector<double>& w) {
  std::partial_sort(keys.begin(), keys.begin() + n, keys.end(),
                    [&w](int64_t x, int64_t y) { return w[x] > w[y] || (w[x] == w[y] && x < y); });
}

}  // namespace qkv::detail
