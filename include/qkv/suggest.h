// The closest known name to a mistyped one: the one rule behind the CLI's "unknown option --head
// (did you mean --heads?)" and the Python API's unknown keyword arguments.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace qkv {

// The name in `known` closest to `given`, or nullopt if none is close. Leading dashes are ignored
// and '-' equals '_' (so --key_lengths finds --key-lengths). Close: at most 2 single-character
// edits (insert, delete, replace), or `given` is a known name with a word added before or after it
// ("is_causal" -> "causal", as PyTorch spells it). The fewest edits win; ties go to the earlier
// name in `known`. Pure; thread-safe.
std::optional<std::string> closest_name(std::string_view given, std::span<const std::string> known);

}  // namespace qkv
