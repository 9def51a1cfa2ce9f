// The .npy header: magic, version, header length, then a Python dict literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }. A small recursive-descent parser
// for the Python literal subset numpy writes, read as Python (numpy's ast.literal_eval) reads it:
// string escapes decoded, a list is not a tuple, (3) is the integer 3, 03 is no integer. What it
// does not read, or reads differently from Python, is refused with a reason, never guessed.
#include "io/npy_header.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "io/mapped_file.h"
#include "qkv/error.h"

namespace qkv::detail {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

struct DictEntry;

struct PyValue {
  enum Kind { string, integer, boolean, none, tuple, list, dict } kind = none;
  std::string text;                // string (escapes decoded; code points past 0x7f as UTF-8)
  int64_t number = 0;              // integer
  bool too_large = false;          // integer outside int64
  bool truth = false;              // boolean
  std::vector<PyValue> items;      // tuple or list
  std::vector<DictEntry> entries;  // dict
};

// Not std::pair: clang rejects a pair of an incomplete PyValue inside PyValue's own definition.
struct DictEntry {
  std::string key;
  PyValue value;
};

class LiteralParser {
 public:
  // python2_longs: a trailing 'L' on an integer is dropped, as numpy does for format 1.0 and 2.0
  // headers (which Python 2 may have written); in 3.0 it is a syntax error.
  LiteralParser(std::string_view text, const std::string& path, bool python2_longs)
      : text_(text), path_(path), python2_longs_(python2_longs) {}

  PyValue parse_all() {
    PyValue v = value(0);
    skip_space();
    if (pos_ != text_.size()) fail(fmt::format("unexpected {} after the dict", quoted(text_.substr(pos_), 20)));
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(fmt::format("{}: bad .npy header: {}", path_, why));
  }
  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool eat_word(std::string_view w) {
    if (text_.substr(pos_, w.size()) != w) return false;
    std::size_t end = pos_ + w.size();
    if (end < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_')) return false;
    pos_ = end;
    return true;
  }

  PyValue value(int depth) {
    if (depth > 8) fail("nesting is too deep");
    skip_space();
    if (pos_ >= text_.size()) fail("it ends in the middle of a value");
    char c = text_[pos_];
    PyValue v;
    if (c == '\'' || c == '"') {
      v.kind = PyValue::string;
      v.text = string_literal();
    } else if (c == '-' || c == '+' || (c >= '0' && c <= '9')) {
      v.kind = PyValue::integer;
      integer_literal(v);
    } else if (c == '(' || c == '[') {
      ++pos_;
      v.kind = c == '(' ? PyValue::tuple : PyValue::list;
      char close = c == '(' ? ')' : ']';
      bool comma = false;  // (x) is x in Python; (x,) and () are tuples
      while (!eat(close)) {
        v.items.push_back(value(depth + 1));
        if (!eat(',')) {
          if (eat(close)) break;
          fail(fmt::format("expected ',' or '{}' in a sequence", close));
        }
        comma = true;
      }
      if (c == '(' && v.items.size() == 1 && !comma) return std::move(v.items[0]);
    } else if (c == '{') {
      ++pos_;
      v.kind = PyValue::dict;
      std::set<std::string> seen;
      while (!eat('}')) {
        PyValue key = value(depth + 1);
        if (key.kind != PyValue::string) fail("a dict key is not a string");
        if (!eat(':')) fail(fmt::format("expected ':' after the key {}", quoted(key.text)));
        // numpy's literal_eval keeps the last copy of a repeated key; refuse the ambiguity.
        if (!seen.insert(key.text).second) fail(fmt::format("the key {} appears twice", quoted(key.text)));
        v.entries.push_back(DictEntry{key.text, value(depth + 1)});
        if (!eat(',')) {
          if (eat('}')) break;
          fail("expected ',' or '}' in the dict");
        }
      }
    } else if (eat_word("True")) {
      v.kind = PyValue::boolean;
      v.truth = true;
    } else if (eat_word("False")) {
      v.kind = PyValue::boolean;
    } else if (eat_word("None")) {
      v.kind = PyValue::none;
    } else {
      fail(fmt::format("unexpected {}", quoted(text_.substr(pos_), 20)));
    }
    return v;
  }

  std::string string_literal() {
    char q = text_[pos_++];
    std::string s;
    while (pos_ < text_.size() && text_[pos_] != q) {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size())
        escape(s);
      else
        s += text_[pos_++];
      if (s.size() > 256) fail("a string is too long");
    }
    if (pos_ >= text_.size()) fail("a string is not closed");
    ++pos_;
    return s;
  }

  // A backslash escape in a string, decoded as Python decodes it ('<\f4' is "<", form feed, "4",
  // which numpy refuses as a dtype, not "<f4"); pos_ is at the backslash.
  void escape(std::string& s) {
    const std::size_t start = pos_++;
    const char c = text_[pos_++];
    switch (c) {
      case '\n':  // a line continuation: nothing
        return;
      case '\r':
        if (pos_ < text_.size() && text_[pos_] == '\n') ++pos_;
        return;
      case '\\':
      case '\'':
      case '"':
        s += c;
        return;
      case 'a':
        s += '\a';
        return;
      case 'b':
        s += '\b';
        return;
      case 'f':
        s += '\f';
        return;
      case 'n':
        s += '\n';
        return;
      case 'r':
        s += '\r';
        return;
      case 't':
        s += '\t';
        return;
      case 'v':
        s += '\v';
        return;
      case 'x':
        append_utf8(s, hex_digits(2, start));
        return;
      case 'u':
        append_utf8(s, hex_digits(4, start));
        return;
      case 'U': {
        const uint32_t cp = hex_digits(8, start);
        if (cp > 0x10ffff) fail(fmt::format("the escape {} is past Unicode", quoted(text_.substr(start, 10))));
        append_utf8(s, cp);
        return;
      }
      case 'N':
        fail(fmt::format("the named escape {} in a string is not supported", quoted(text_.substr(start, 20))));
      default:
        break;
    }
    if (c >= '0' && c <= '7') {  // up to three octal digits
      uint32_t cp = static_cast<uint32_t>(c - '0');
      for (int n = 1; n < 3 && pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '7'; ++n)
        cp = cp * 8 + static_cast<uint32_t>(text_[pos_++] - '0');
      append_utf8(s, cp);
      return;
    }
    // Python keeps an unknown escape as it is: '\<f4' is backslash, "<f4".
    s += '\\';
    --pos_;
  }

  // Exactly n hex digits after an escape starting at `start` (Python refuses fewer).
  uint32_t hex_digits(int n, std::size_t start) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      const char h = pos_ < text_.size() ? text_[pos_] : '\0';
      const int digit = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
      if (digit < 0) fail(fmt::format("the escape {} needs {} hex digits", quoted(text_.substr(start, 2 + i + 1)), n));
      v = v * 16 + static_cast<uint32_t>(digit);
      ++pos_;
    }
    return v;
  }

  static void append_utf8(std::string& s, uint32_t cp) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
      return;
    }
    if (cp < 0x800) {
      s += static_cast<char>(0xc0 | cp >> 6);
    } else {
      if (cp < 0x10000) {
        s += static_cast<char>(0xe0 | cp >> 12);
      } else {
        s += static_cast<char>(0xf0 | cp >> 18);
        s += static_cast<char>(0x80 | (cp >> 12 & 0x3f));
      }
      s += static_cast<char>(0x80 | (cp >> 6 & 0x3f));
    }
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }

  void integer_literal(PyValue& v) {
    bool negative = text_[pos_] == '-';
    if (text_[pos_] == '-' || text_[pos_] == '+') ++pos_;
    std::size_t start = pos_;
    uint64_t magnitude = 0;
    bool nonzero = false;
    auto is_digit = [&](std::size_t at) { return at < text_.size() && text_[at] >= '0' && text_[at] <= '9'; };
    while (is_digit(pos_)) {
      unsigned digit = static_cast<unsigned>(text_[pos_++] - '0');
      nonzero |= digit != 0;
      if (magnitude > (std::numeric_limits<uint64_t>::max() - digit) / 10)
        v.too_large = true;
      else
        magnitude = magnitude * 10 + digit;
      if (pos_ + 1 < text_.size() && text_[pos_] == '_' && is_digit(pos_ + 1)) ++pos_;  // 1_000
    }
    if (pos_ == start) fail("a sign is not followed by digits");
    const std::string_view digits = text_.substr(start, pos_ - start);
    // Python 3 refuses 03 ("leading zeros in decimal integer literals"); 0 and 00 are zero.
    if (digits[0] == '0' && nonzero)
      fail(fmt::format("the integer {} has a leading zero, which Python refuses", quoted(digits)));
    if (python2_longs_ && pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
      fail("a number is not an integer");
    if (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
      fail(fmt::format("unexpected {} after the integer {}", quoted(text_.substr(pos_, 1)), quoted(digits)));
    if (magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) v.too_large = true;
    v.number = v.too_large ? 0 : (negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude));
  }

  std::string_view text_;
  const std::string& path_;
  bool python2_longs_;
  std::size_t pos_ = 0;
};

// numpy's descr, read as np.dtype reads it (np.load hands it the string): an optional byte order
// ('<' little, '>' big, '=' native, '|' not applicable; none is native) and a kind and size ('f4')
// or a one-character type code ('f', 'd', '?'), or a bare type name ('float32', 'double', 'int');
// numpy refuses a byte order before a name. 'f4', '=f4' and '|f4' are the native float32,
// little-endian here; 'l' and 'int' are int64, as on every LP64 machine. Stored in h.info.descr
// the way numpy itself writes that dtype (dtype.str): '<' for the multi-byte types, '|' for the
// one-byte ones.
void parse_descr(const std::string& descr, NpyHeader& h, const std::string& path) {
  static constexpr struct {
    std::string_view name;
    NpyType type;
    std::size_t size;
  } kTypes[] = {{"f4", NpyType::f4, 4}, {"f8", NpyType::f8, 8}, {"f2", NpyType::f2, 2}, {"b1", NpyType::b1, 1},
                {"u1", NpyType::u1, 1}, {"i1", NpyType::i1, 1}, {"i4", NpyType::i4, 4}, {"i8", NpyType::i8, 8}};
  // Other spellings numpy 1.x accepts for those types, as the kind and size they stand for.
  static constexpr std::pair<std::string_view, std::string_view> kCodes[] = {
      {"f", "f4"}, {"d", "f8"}, {"e", "f2"}, {"?", "b1"}, {"B", "u1"},
      {"b", "i1"}, {"i", "i4"}, {"q", "i8"}, {"l", "i8"}, {"p", "i8"}};
  static constexpr std::pair<std::string_view, std::string_view> kNames[] = {
      {"float32", "f4"},  {"single", "f4"}, {"float64", "f8"}, {"double", "f8"}, {"float", "f8"}, {"float_", "f8"},
      {"float16", "f2"},  {"half", "f2"},   {"bool", "b1"},    {"bool_", "b1"},  {"bool8", "b1"}, {"uint8", "u1"},
      {"ubyte", "u1"},    {"int8", "i1"},   {"byte", "i1"},    {"int32", "i4"},  {"intc", "i4"},  {"int64", "i8"},
      {"longlong", "i8"}, {"int_", "i8"},   {"int", "i8"},     {"long", "i8"},   {"intp", "i8"},  {"int0", "i8"}};
  const std::string supported = "supported: <f4 <f8 <f2 |b1 |u1 |i1 <i4 <i8";
  std::string_view code = descr;
  char order = '=';
  for (const auto& [name, kind] : kNames)
    if (code == name) code = kind;
  if (!code.empty() && (code[0] == '<' || code[0] == '>' || code[0] == '=' || code[0] == '|')) {
    order = code[0];
    code.remove_prefix(1);
  }
  for (const auto& [c, kind] : kCodes)
    if (code == c) code = kind;
  for (const auto& t : kTypes) {
    if (code != t.name) continue;
    if (order == '>' && t.size > 1)
      throw Error(
          fmt::format("{}: big-endian .npy data ('{}') is not supported; convert it with "
                      "a.astype('<{}') before saving",
                      path, descr, t.name));
    h.type = t.type;
    h.item_size = t.size;
    h.info.descr = fmt::format("{}{}", t.size == 1 ? '|' : '<', t.name);
    return;
  }
  // quoted: the descr is the file's text, control bytes included (one line on stderr).
  throw Error(fmt::format("{}: unsupported .npy dtype {} ({})", path, quoted(descr, 40), supported));
}

uint32_t read_le(std::string_view file, std::size_t at, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(file[at + i]);
  return v;
}

}  // namespace

NpyHeader parse_npy_header(std::string_view file, const std::string& path) {
  if (file.size() < 10 || file.substr(0, kMagic.size()) != kMagic) {
    if (file.size() >= kMagic.size() && file.substr(0, kMagic.size()) != kMagic)
      throw Error(fmt::format("{}: not a .npy file (it does not start with \\x93NUMPY)", path));
    throw Error(fmt::format("{}: not a .npy file (only {} bytes, too short for a header)", path, file.size()));
  }
  int major = static_cast<unsigned char>(file[6]);
  int minor = static_cast<unsigned char>(file[7]);
  if (!((major == 1 || major == 2 || major == 3) && minor == 0))
    throw Error(
        fmt::format("{}: unsupported .npy format version {}.{} (supported: 1.0, 2.0, 3.0)", path, major, minor));
  std::size_t prefix = major == 1 ? 10 : 12;
  if (file.size() < prefix)
    throw Error(fmt::format("{}: truncated .npy file ({} bytes, too short for a header)", path, file.size()));
  std::size_t header_len = read_le(file, 8, major == 1 ? 2 : 4);
  if (header_len > file.size() - prefix)
    throw Error(fmt::format("{}: truncated .npy file: the header length is {} bytes but only {} follow", path,
                            header_len, file.size() - prefix));

  // numpy (1.24+) refuses a header of over 10,000 characters as unsafe to parse; so does qkv, which
  // would otherwise accept what numpy's np.load does not (format 3.0 counts UTF-8 code points).
  constexpr std::size_t kMaxHeaderChars = 10000;
  const std::string_view text = file.substr(prefix, header_len);
  const std::size_t chars =
      major <= 2 ? text.size() : static_cast<std::size_t>(std::count_if(text.begin(), text.end(), [](char c) {
        return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
      }));
  if (chars > kMaxHeaderChars)
    throw Error(fmt::format("{}: bad .npy header: {} characters, over numpy's limit of {} (np.load refuses it too)",
                            path, chars, kMaxHeaderChars));
  PyValue dict = LiteralParser(text, path, major <= 2).parse_all();
  if (dict.kind != PyValue::dict) throw Error(fmt::format("{}: bad .npy header: it is not a dict", path));
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (const auto& [key, v] : dict.entries) {
    const PyValue** slot = key == "descr"           ? &descr
                           : key == "fortran_order" ? &fortran
                           : key == "shape"         ? &shape
                                                    : nullptr;
    if (slot == nullptr) throw Error(fmt::format("{}: bad .npy header: unexpected key {}", path, quoted(key)));
    *slot = &v;
  }
  for (auto [v, name] : {std::pair{descr, "descr"}, std::pair{fortran, "fortran_order"}, std::pair{shape, "shape"}})
    if (v == nullptr) throw Error(fmt::format("{}: bad .npy header: the key '{}' is missing", path, name));
  if (descr->kind != PyValue::string)
    throw Error(fmt::format("{}: unsupported .npy dtype: structured arrays are not supported", path));
  if (fortran->kind != PyValue::boolean)
    throw Error(fmt::format("{}: bad .npy header: 'fortran_order' is not True or False", path));
  if (shape->kind != PyValue::tuple)
    throw Error(fmt::format("{}: bad .npy header: 'shape' is not a tuple{}", path,
                            shape->kind == PyValue::list ? " (it is a list, which numpy refuses)" : ""));

  NpyHeader h;
  h.info.fortran_order = fortran->truth;
  parse_descr(descr->text, h, path);
  for (const PyValue& d : shape->items) {
    if (d.kind != PyValue::integer)
      throw Error(fmt::format("{}: bad .npy header: a dimension is not an integer", path));
    if (d.too_large) throw Error(fmt::format("{}: bad .npy header: a dimension is too large", path));
    if (d.number < 0)
      throw Error(fmt::format("{}: bad .npy header: negative dimension {} in the shape", path, d.number));
    h.info.shape.push_back(d.number);
  }
  if (h.info.shape.size() > 4)
    throw Error(fmt::format("{}: the array has rank {} (shape {}); qkv supports rank 0 to 4", path, h.info.shape.size(),
                            shape_string(h.info.shape)));

  // Compare the declared size with the file before anything is allocated.
  h.data_offset = prefix + header_len;
  const uint64_t available = file.size() - h.data_offset;
  unsigned __int128 bytes = h.item_size;
  for (int64_t d : h.info.shape) {
    bytes *= static_cast<uint64_t>(d);
    if (bytes > (static_cast<unsigned __int128>(1) << 64) - 1)
      throw Error(
          fmt::format("{}: the shape {} declares more bytes than can be addressed", path, shape_string(h.info.shape)));
  }
  h.data_bytes = static_cast<uint64_t>(bytes);
  if (h.data_bytes > available)
    throw Error(
        fmt::format("{}: truncated .npy file: the header (shape {}, {}) declares {} bytes but the file holds {}", path,
                    shape_string(h.info.shape), h.info.descr, h.data_bytes, available));
  if (h.data_bytes < available)
    throw Error(fmt::format("{}: the header (shape {}, {}) declares {} bytes but the file holds {} ({} trailing bytes)",
                            path, shape_string(h.info.shape), h.info.descr, h.data_bytes, available,
                            available - h.data_bytes));
  return h;
}

}  // namespace qkv::detail
