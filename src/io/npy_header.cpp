// The .npy header: magic, version, header length, then a Python dict literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }. A small recursive-descent parser
// for the Python literal subset numpy writes; anything else is refused with a reason.
#include "io/npy_header.h"

#include <cctype>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "io/mapped_file.h"
#include "qkv/error.h"

namespace qkv::detail {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

struct DictEntry;

struct PyValue {
  enum Kind { string, integer, boolean, none, tuple, dict } kind = none;
  std::string text;                // string
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
  LiteralParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

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
      v.kind = PyValue::tuple;
      char close = c == '(' ? ')' : ']';
      while (!eat(close)) {
        v.items.push_back(value(depth + 1));
        if (!eat(',')) {
          if (eat(close)) break;
          fail(fmt::format("expected ',' or '{}' in a sequence", close));
        }
      }
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
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;
      s += text_[pos_++];
      if (s.size() > 256) fail("a string is too long");
    }
    if (pos_ >= text_.size()) fail("a string is not closed");
    ++pos_;
    return s;
  }

  void integer_literal(PyValue& v) {
    bool negative = text_[pos_] == '-';
    if (text_[pos_] == '-' || text_[pos_] == '+') ++pos_;
    std::size_t start = pos_;
    uint64_t magnitude = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      unsigned digit = static_cast<unsigned>(text_[pos_++] - '0');
      if (magnitude > (std::numeric_limits<uint64_t>::max() - digit) / 10)
        v.too_large = true;
      else
        magnitude = magnitude * 10 + digit;
    }
    if (pos_ == start) fail("a sign is not followed by digits");
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) ++pos_;  // Python 2 long
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
      fail("a number is not an integer");
    if (magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) v.too_large = true;
    v.number = v.too_large ? 0 : (negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude));
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

// numpy's descr: byte order ('<' little, '>' big, '=' native, '|' not applicable), kind, size.
void parse_descr(const std::string& descr, NpyHeader& h, const std::string& path) {
  static constexpr struct {
    std::string_view name;
    NpyType type;
    std::size_t size;
  } kTypes[] = {{"f4", NpyType::f4, 4}, {"f8", NpyType::f8, 8}, {"f2", NpyType::f2, 2}, {"b1", NpyType::b1, 1},
                {"u1", NpyType::u1, 1}, {"i1", NpyType::i1, 1}, {"i4", NpyType::i4, 4}, {"i8", NpyType::i8, 8}};
  const std::string supported = "supported: <f4 <f8 <f2 |b1 |u1 |i1 <i4 <i8";
  // quoted: the descr is the file's text, control bytes included (one line on stderr).
  auto unsupported = [&] {
    return Error(fmt::format("{}: unsupported .npy dtype {} ({})", path, quoted(descr, 40), supported));
  };
  if (descr.size() < 2) throw unsupported();
  char order = descr[0];
  std::string_view rest = std::string_view(descr).substr(1);
  for (const auto& t : kTypes) {
    if (rest != t.name) continue;
    if (order == '>' && t.size > 1)
      throw Error(
          fmt::format("{}: big-endian .npy data ('{}') is not supported; convert it with "
                      "a.astype('<{}') before saving",
                      path, descr, t.name));
    bool ok = order == '<' || order == '=' || (t.size == 1 && (order == '|' || order == '>'));
    if (!ok) break;
    h.type = t.type;
    h.item_size = t.size;
    return;
  }
  throw unsupported();
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

  PyValue dict = LiteralParser(file.substr(prefix, header_len), path).parse_all();
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
  if (shape->kind != PyValue::tuple) throw Error(fmt::format("{}: bad .npy header: 'shape' is not a tuple", path));

  NpyHeader h;
  h.info.descr = descr->text;
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
