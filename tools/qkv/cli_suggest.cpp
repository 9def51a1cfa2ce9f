// "unknown option --head (did you mean --heads?)": the mistyped option is named, with the closest
// option of the subcommand (qkv/suggest.h), instead of CLI11's message about unexpected arguments.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli_util.h"
#include "qkv/suggest.h"

namespace qkv::cli {

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
    const std::optional<std::string> best = closest_name(given, known);
    const std::string where = sub ? "qkv " + sub->get_name() : "qkv";
    return best ? fmt::format("unknown option {} (did you mean {}?)", given, *best)
                : fmt::format("unknown option {} (see {} --help)", given, where);
  }
  return std::nullopt;
}

}  // namespace qkv::cli
