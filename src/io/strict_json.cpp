#include "io/strict_json.h"

#include <set>
#include <vector>

#include <fmt/format.h>

#include "io/mapped_file.h"
#include "qkv/error.h"

namespace qkv::detail {
namespace {

using nlohmann::json;

// The checks run as a SAX pass before the tree is built: nlohmann's parse callback rescans the
// parent container each time an object closes (time quadratic in the entries), and checking the
// finished tree would build it first, whatever its size. The tree then comes from a second, plain
// parse (linear too): nlohmann's SAX tree builder is in its detail namespace, not its API.
class StrictChecks {
 public:
  StrictChecks(const std::string& path, std::string_view what) : path_(path), what_(what) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t&) { return value(); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return open(); }
  bool key(json::string_t& key) {
    if (!open_.back().insert(key).second)
      throw Error(fmt::format("{}: {} has the key {} twice in one object", path_, what_, detail::quoted(key)));
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    throw Error(fmt::format("{}: {} is not valid JSON: {}", path_, what_, e.what()));
  }

 private:
  bool value() {
    if (++values_ > kStrictJsonMaxValues)
      throw Error(fmt::format("{}: {} holds more than {} values", path_, what_, kStrictJsonMaxValues));
    return true;
  }
  bool open() {
    if (open_.size() == kStrictJsonMaxDepth)
      throw Error(fmt::format("{}: {} nests deeper than {} levels", path_, what_, kStrictJsonMaxDepth));
    open_.emplace_back();  // an array's set stays empty
    return value();
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  const std::string& path_;
  std::string_view what_;
  std::vector<std::set<std::string>> open_;  // the keys of each open container
  std::size_t values_ = 0;
};

}  // namespace

nlohmann::json parse_strict_json(std::string_view text, const std::string& path, std::string_view what) {
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw Error(fmt::format("{}: {} holds a NUL byte at offset {} (JSON has none)", path, what, nul));
  StrictChecks checks(path, what);
  json::sax_parse(text.begin(), text.end(), &checks);
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // sax_parse accepted it, so only allocation is left
    throw Error(fmt::format("{}: {} is not valid JSON: {}", path, what, e.what()));
  }
}

}  // namespace qkv::detail
