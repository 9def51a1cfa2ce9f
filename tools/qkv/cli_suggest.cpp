// "unknown option --head (did you mean --heads?)": the mistyped option is named, with the closest
// option of the subcommand, instead of CLI11's message about unexpected arguments.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli_util.h"

namespace qkv::cli {
namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::optional<std::string> unknown_option_message(const CLI::App& app, int argc, char** argv) {
  const CLI::App* sub = nullptr;
  for (const CLI::App* s : app.get_subcommands({}))
    if (argc > 1 && s->get_name() == argv[1]) sub = s;
  const CLI::App& scope = sub ? *sub : app;
  std::vector<std::string> known;
  for (const CLI::Option* o : scope.get_options())
    for (const std::string& name : o->get_lnames()) known.push_back("--" + name);
  for (int i = sub ? 2 : 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (std::strncmp(argv[i], "--", 2) != 0) continue;
    const std::string given = std::string(argv[i]).substr(0, std::string(argv[i]).find('='));
    if (std::find(known.begin(), known.end(), given) != known.end()) continue;
    std::string best;
    std::size_t best_distance = 3;  // suggest only close names
    for (const std::string& k : known)
      if (const std::size_t d = edit_distance(given, k); d < best_distance) best = k, best_distance = d;
    const std::string where = sub ? "qkv " + sub->get_name() : "qkv";
    return best.empty() ? fmt::format("unknown option {} (see {} --help)", given, where)
                        : fmt::format("unknown option {} (did you mean {}?)", given, best);
  }
  return std::nullopt;
}

}  // namespace qkv::cli
