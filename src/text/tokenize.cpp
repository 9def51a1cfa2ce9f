// tokenize(): lowercase ASCII words; ASCII punctuation, whitespace and U+FEFF separate and are dropped.
#include "qkv/embeddings.h"

namespace qkv {

std::vector<std::string> tokenize(std::string_view sentence) {
  // U+FEFF, the byte-order mark some editors put at the start of a text file: invisible, so a
  // word it clings to ("\uFEFFthe") would be reported missing or fail to match as if misspelled.
  constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";
  std::vector<std::string> tokens;
  std::string current;
  for (std::size_t i = 0; i < sentence.size(); ++i) {
    const char ch = sentence[i];
    const auto c = static_cast<unsigned char>(ch);
    const bool mark = c == 0xEF && sentence.compare(i, kByteOrderMark.size(), kByteOrderMark) == 0;
    // Bytes >= 0x80 are parts of UTF-8 sequences: keeping them inside the word keeps "café" whole.
    const bool word_byte =
        !mark && (c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'));
    if (mark) i += kByteOrderMark.size() - 1;
    if (word_byte) {
      current += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : ch;
    } else if (!current.empty()) {
      tokens.push_back(std::move(current));
      current.clear();
    }
  }
  if (!current.empty()) tokens.push_back(std::move(current));
  return tokens;
}

}  // namespace qkv
