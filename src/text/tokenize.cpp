// tokenize(): lowercase ASCII words; ASCII punctuation and whitespace separate and are dropped.
#include "qkv/embeddings.h"

namespace qkv {

std::vector<std::string> tokenize(std::string_view sentence) {
  std::vector<std::string> tokens;
  std::string current;
  for (char ch : sentence) {
    unsigned char c = static_cast<unsigned char>(ch);
    // Bytes >= 0x80 are parts of UTF-8 sequences: keeping them inside the word keeps "café" whole.
    bool word_byte = c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
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
