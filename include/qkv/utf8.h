// UTF-8 validity, as Python's strict decoder sees it (for words handed to Python as str).
#pragma once

#include <cstddef>
#include <string_view>

namespace qkv {

// Offset of the first byte of `s` that starts no valid UTF-8 sequence (a stray continuation
// byte, a truncated sequence, an overlong form, a surrogate U+D800-DFFF, or a code point above
// U+10FFFF), or std::string_view::npos if all of `s` is valid. Pure; thread-safe.
std::size_t invalid_utf8_at(std::string_view s);

}  // namespace qkv
