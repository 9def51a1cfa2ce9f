#include "io/strict_json.h"

#include <set>
#include <vector>

#include <fmt/format.h>

#include "io/mapped_file.h"
#include "qkv/error.h"

namespace qkv::detail {

nlohmann::json parse_strict_json(std::string_view text, const std::string& path, std::string_view what) {
  using nlohmann::json;
  constexpr int kMaxDepth = 16;
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw Error(fmt::format("{}: {} holds a NUL byte at offset {} (JSON has none)", path, what, nul));
  // Throwing from the callback bounds the nesting before it is built.
  std::vector<std::set<std::string>> keys;  // one per open object
  json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxDepth) throw Error(fmt::format("{}: {} nests deeper than {} levels", path, what, kMaxDepth));
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
      throw Error(fmt::format("{}: {} has the key {} twice in one object", path, what,
                              detail::quoted(parsed.get<std::string>())));
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: {} is not valid JSON: {}", path, what, e.what()));
  }
}

}  // namespace qkv::detail
