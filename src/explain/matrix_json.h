// Internal: an explanation matrix as JSON (an array of rows, or null when empty), shared by the
// JSON rendering of explanations and the data the HTML pages embed.
#pragma once

#include <nlohmann/json.hpp>

#include "qkv/explain.h"

namespace qkv::detail {

nlohmann::json matrix_json(const Matrix& m);

}  // namespace qkv::detail
