// The one JSON reader for files qkv takes from others (safetensors headers, a .npy weights
// directory's qkv_layer.json): stricter than nlohmann's parser where a lenient reading would let
// one file mean different things to different programs, or let a hostile file cost too much.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace qkv::detail {

// Containers open at once, and values (a container counts as one) in a text. The values bound the
// tree's memory (tens of bytes a value) for a text of short values such as "[],[],...": a
// safetensors header takes about ten a tensor.
inline constexpr std::size_t kStrictJsonMaxDepth = 16;
inline constexpr std::size_t kStrictJsonMaxValues = std::size_t{1} << 21;

// Parses `text` as JSON, in time and memory linear in its size. Throws qkv::Error
// "<path>: <what> ..." when it is not valid JSON, nests deeper than kStrictJsonMaxDepth
// containers, holds more than kStrictJsonMaxValues values, holds a NUL byte (nlohmann's lexer
// ends the input there, so "{...}\0garbage" parsed as "{...}") or has a key twice in one object
// (nlohmann keeps the last copy, other readers the first). `what` names the text, e.g. "the
// safetensors header".
nlohmann::json parse_strict_json(std::string_view text, const std::string& path, std::string_view what);

}  // namespace qkv::detail
