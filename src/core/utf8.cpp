// invalid_utf8_at: one pass, each lead byte's length and the code point's allowed range.
#include "qkv/utf8.h"

#include <cstdint>

namespace qkv {

std::size_t invalid_utf8_at(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    // Continuation bytes after the lead; -1 for a byte that cannot lead.
    const int n = b < 0x80 ? 0 : (b & 0xE0) == 0xC0 ? 1 : (b & 0xF0) == 0xE0 ? 2 : (b & 0xF8) == 0xF0 ? 3 : -1;
    if (n < 0 || i + static_cast<std::size_t>(n) >= s.size() + (n == 0)) return i;  // bad lead or truncated
    uint32_t cp = n == 0 ? b : b & (0x3Fu >> n);
    for (int k = 1; k <= n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      if ((c & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (c & 0x3Fu);
    }
    const uint32_t lowest[] = {0, 0x80, 0x800, 0x10000};
    if (cp < lowest[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += static_cast<std::size_t>(n) + 1;
  }
  return std::string_view::npos;
}

}  // namespace qkv
