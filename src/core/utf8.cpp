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

namespace {

// The length of the valid sequence at s[i], else 0 and *subpart = the length of the maximal
// subpart of one (at least 1): the lead byte and the continuation bytes that could still have
// completed it (Unicode's "U+FFFD substitution of maximal subparts", which Python follows).
std::size_t sequence_at(std::string_view s, std::size_t i, std::size_t* subpart) {
  const auto b = static_cast<unsigned char>(s[i]);
  *subpart = 1;
  if (b < 0x80) return 1;
  const std::size_t n = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
  if (n == 0) return 0;
  // The second byte's range narrows for E0 (no overlong), ED (no surrogates), F0 and F4.
  const unsigned char lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80;
  const unsigned char hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
  for (std::size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    const auto c = static_cast<unsigned char>(s[i + k]);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 0;
    *subpart = k + 1;
  }
  return n;
}

}  // namespace

std::string repair_utf8(std::string_view s, InvalidUtf8 how) {
  if (how == InvalidUtf8::keep || invalid_utf8_at(s) == std::string_view::npos) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (std::size_t i = 0; i < s.size();) {
    std::size_t subpart = 1;
    const std::size_t n = sequence_at(s, i, &subpart);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    if (how == InvalidUtf8::replace) out += "\xEF\xBF\xBD";  // U+FFFD
    i += subpart;
  }
  return out;
}

}  // namespace qkv
