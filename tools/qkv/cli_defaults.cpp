// Where the `qkv` command finds the data it uses by default (word vectors, the trained layer):
// one search, the same for a build tree, an installed prefix, the .deb and the pip package.
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cli_util.h"

namespace qkv::cli {
namespace {

namespace fs = std::filesystem;

// The directories find_data_file searches, in order. The executable's own directory comes from
// /proc/self/exe, not argv[0], so a `qkv` found through PATH or a symlink still finds its data.
std::vector<fs::path> data_dirs() {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("QKV_DATA_DIR"); env != nullptr && env[0] != '\0') dirs.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.has_parent_path()) {
    const fs::path bin = exe.parent_path();
    dirs.push_back(bin / "data");                  // a build tree: build/qkv, build/data/
    dirs.push_back(bin / ".." / "share" / "qkv");  // a prefix, the .deb, and the pip package's qkv/bin
  }
  return dirs;
}

}  // namespace

std::string data_search_path() { return "$QKV_DATA_DIR, <dir of qkv>/data, <dir of qkv>/../share/qkv"; }

std::string find_data_file(std::string_view name) {
  std::error_code ec;
  for (const fs::path& dir : data_dirs()) {
    const fs::path path = dir / fs::path(name);
    if (fs::is_regular_file(path, ec)) return path.lexically_normal().string();
  }
  return "";
}

std::string default_embeddings_rule() {
  return fmt::format(
      "default: $QKV_EMBEDDINGS, else words.txt in {} (GCIDE word vectors built by `make demo`, "
      "installed under share/qkv; QKV_EMBEDDINGS= empty: no default)",
      data_search_path());
}

std::string file_name(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return name.empty() ? path : name;
}

void resolve_default_embeddings(SentenceArgs& args) {
  if (!args.embeddings.empty()) return;
  const char* env = std::getenv("QKV_EMBEDDINGS");
  if (env != nullptr && env[0] != '\0') {
    args.embeddings = env;
    return;
  }
  // QKV_EMBEDDINGS set but empty turns the default off (scripts and tests rely on it).
  if (env == nullptr) {
    args.embeddings = find_data_file("words.txt");
    if (!args.embeddings.empty()) return;
  }
  usage_error(fmt::format(
      "no word vectors: pass --embeddings F, set QKV_EMBEDDINGS=F, or build the default words.txt with `make demo` "
      "(searched: {})",
      data_search_path()));
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

std::vector<std::pair<std::string, std::string>> sentence_inputs(const SentenceArgs& args) {
  std::vector<std::pair<std::string, std::string>> inputs{{"the word vectors", args.embeddings}};
  try {
    inputs.emplace_back("the layer", layer_file(args));
  } catch (const Error&) {
  }
  return inputs;
}

}  // namespace qkv::cli
