// What fuzz_tokenize.cpp checks of qkv::tokenize, the sentence tokenizer every sentence command,
// the masked-word corpus reader and the Python module share (also run on the committed corpus by
// FuzzCorpus.TokenizeInputs). Invariants, against an independent scan of the bytes: tokens are
// exactly the maximal runs of word bytes (ASCII letters and digits, and every byte >= 0x80 so
// UTF-8 stays whole, except the three of U+FEFF, a byte-order mark, which separate, read from the
// left), ASCII letters lowercased, nothing else kept; and joining the tokens with spaces
// tokenizes back to the same tokens (the corpus reader relies on that).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/embeddings.h"

namespace qkv::fuzz {

inline bool word_byte(unsigned char c) {
  return c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

inline constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";

inline std::vector<std::string> word_runs(std::string_view s) {
  std::vector<std::string> out;
  bool in_word = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    const auto c = static_cast<unsigned char>(ch);
    if (s.substr(i, kByteOrderMark.size()) == kByteOrderMark) {
      i += kByteOrderMark.size() - 1;
      in_word = false;
      continue;
    }
    if (!word_byte(c)) {
      in_word = false;
      continue;
    }
    if (!in_word) out.emplace_back();
    in_word = true;
    out.back() += (c >= 'A' && c <= 'Z') ? static_cast<char>(c + ('a' - 'A')) : ch;
  }
  return out;
}

// nullptr if tokenize(text) keeps the invariants above, else which one it broke.
inline const char* tokenize_broken(std::string_view text) {
  const std::vector<std::string> tokens = qkv::tokenize(text);
  for (const std::string& t : tokens) {
    if (t.empty()) return "tokenize returned an empty token";
    if (t.find(kByteOrderMark) != std::string::npos) return "a token holds a byte-order mark";
    for (const char ch : t) {
      const auto c = static_cast<unsigned char>(ch);
      if (!word_byte(c)) return "a token holds a separator byte";
      if (c >= 'A' && c <= 'Z') return "a token holds an uppercase ASCII letter";
    }
  }
  if (tokens != word_runs(text)) return "tokens are not the input's runs of word bytes";
  std::string joined;
  for (const std::string& t : tokens) {
    if (!joined.empty()) joined += ' ';
    joined += t;
  }
  if (qkv::tokenize(joined) != tokens) return "joined tokens do not tokenize back to themselves";
  return nullptr;
}

}  // namespace qkv::fuzz
