// UTF-8 validity, as Python's strict decoder sees it (for words handed to Python as str).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace qkv {

// Offset of the first byte of `s` that starts no valid UTF-8 sequence (a stray continuation
// byte, a truncated sequence, an overlong form, a surrogate U+D800-DFFF, or a code point above
// U+10FFFF), or std::string_view::npos if all of `s` is valid. Pure; thread-safe.
std::size_t invalid_utf8_at(std::string_view s);

// What becomes of the bytes of a word that are not valid UTF-8: kept as they are (words as bytes,
// the CLI), or, where words must be text, each maximal invalid subsequence replaced by U+FFFD or
// dropped: Python's bytes.decode("utf-8", errors="replace" / "ignore"), and gensim's unicode_errors.
enum class InvalidUtf8 { keep, replace, ignore };

// `s` with its invalid sequences treated as `how` says (valid input comes back unchanged). Pure.
std::string repair_utf8(std::string_view s, InvalidUtf8 how);

}  // namespace qkv
