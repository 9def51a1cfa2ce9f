// libFuzzer target: qkv::invalid_utf8_at, which decides which embedding words Python may see.
// Invariants: the bytes before a reported fault are valid on their own; a valid input decodes
// to code points that re-encode to exactly the same bytes (so no overlong form, surrogate or
// out-of-range value passes), checked with an independent encoder.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "qkv/utf8.h"

namespace {

std::string encode(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  const std::size_t bad = qkv::invalid_utf8_at(s);
  if (bad != std::string_view::npos) {
    if (bad >= size) qkv::fuzz::invariant_failed("the fault offset is past the end");
    if (qkv::invalid_utf8_at(s.substr(0, bad)) != std::string_view::npos)
      qkv::fuzz::invariant_failed("the bytes before the fault are not valid");
    return 0;
  }
  // Decode naively (the validator vouched for the structure) and re-encode.
  std::string again;
  for (std::size_t i = 0; i < size;) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int n = b < 0x80 ? 0 : b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
    uint32_t cp = n == 0 ? b : b & (0x3Fu >> n);
    for (int k = 1; k <= n; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]) & 0x3Fu);
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) qkv::fuzz::invariant_failed("a surrogate or >U+10FFFF passed");
    again += encode(cp);
    i += static_cast<std::size_t>(n) + 1;
  }
  if (again != s) qkv::fuzz::invariant_failed("valid input does not re-encode to itself (overlong form passed)");
  return 0;
}
