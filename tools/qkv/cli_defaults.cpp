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

namespace qkv::cli {

std::string find_data_file(std::string_view name) {
  // Beside the default word vectors: the trained layer goes with the vectors it was trained on.
  const std::string built = QKV_DEFAULT_EMBEDDINGS;
  if (built.empty()) return {};
  const std::filesystem::path candidate = std::filesystem::path(built).parent_path() / name;
  std::error_code ec;
  return std::filesystem::is_regular_file(candidate, ec) ? candidate.string() : std::string();
}

std::string layer_file(const SentenceArgs& args) {
  if (!args.weights.empty()) return args.weights;
  if (args.random || args.parameter_free) return {};
  const std::string layer = find_data_file(kDefaultLayerName);
  const std::string alternatives =
      "--weights F (`qkv train --task context --embeddings VECTORS --save F` trains one), --random-weights SEED "
      "(a random layer) or --parameter-free (Q = K = V = X)";
  if (layer.empty())
    throw Error(fmt::format("no trained layer: `make demo` builds {} beside the word vectors; or pass {}",
                            kDefaultLayerName, alternatives));
  // A layer is trained on one set of vectors: with any other file its weights mean nothing.
  const std::filesystem::path words = std::filesystem::path(layer).parent_path() / "words.txt";
  std::error_code ec;
  if (!std::filesystem::equivalent(words, args.embeddings, ec))
    throw Error(fmt::format("the trained layer {} goes with the word vectors {}, not {}: pass {}", layer,
                            words.string(), args.embeddings, alternatives));
  return layer;
}

}  // namespace qkv::cli
