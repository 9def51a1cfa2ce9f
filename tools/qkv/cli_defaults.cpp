// Where the sentence commands find word vectors when --embeddings is not given: $QKV_EMBEDDINGS,
// else the real-word vectors that `make demo` trains into the build tree (compiled-in path).
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "cli_util.h"

#ifndef QKV_DEFAULT_EMBEDDINGS
#define QKV_DEFAULT_EMBEDDINGS ""
#endif

namespace qkv::cli {

std::string default_embeddings_rule() {
  return fmt::format(
      "default: $QKV_EMBEDDINGS, else {} (GCIDE word vectors built by `make demo`; "
      "QKV_EMBEDDINGS= empty: no default)",
      QKV_DEFAULT_EMBEDDINGS);
}

std::string file_name(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  return name.empty() ? path : name;
}

void resolve_default_embeddings(SentenceArgs& args) {
  if (!args.embeddings.empty()) return;
  const char* env = std::getenv("QKV_EMBEDDINGS");
  if (env != nullptr && env[0] != '\0') {
    args.embeddings = env;
    return;
  }
  const std::string built = QKV_DEFAULT_EMBEDDINGS;
  std::error_code ec;
  // QKV_EMBEDDINGS set but empty turns the built-in default off (scripts and tests rely on it).
  if (env == nullptr && !built.empty() && std::filesystem::is_regular_file(built, ec)) {
    args.embeddings = built;
    return;
  }
  usage_error(
      fmt::format("no word vectors: pass --embeddings F, set QKV_EMBEDDINGS=F, or build the default {} "
                  "with `make demo` (or `cmake --build build --target embeddings`)",
                  built.empty() ? std::string("data/words.txt") : built));
}

}  // namespace qkv::cli
