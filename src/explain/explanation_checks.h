// Internal: the consistency an Explanation's renderings rely on (text, JSON-fed pages, HTML). An
// Explanation is a plain struct a caller can fill by hand, so its counts and sizes are checked
// before anything indexes by them.
#pragma once

#include <string_view>

#include "qkv/explain.h"

namespace qkv::detail {

// Throws qkv::Error "<what>: ..." unless: every matrix holds rows × cols values; heads has
// num_heads entries and num_kv_heads divides num_heads; x, concat, output and each head's q, k, v,
// context have one row per token, and its scores, scaled scores and weights are [N, N] (each
// may be empty).
void check_explanation(const Explanation& e, std::string_view what);

}  // namespace qkv::detail
