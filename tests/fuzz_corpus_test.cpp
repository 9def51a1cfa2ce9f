// Replays the committed fuzz corpora (fuzz/corpus/<target>/: the seeds and every input a fuzzer
// ever crashed on) through the readers in the ordinary test binary, so the regression inputs run
// in every build, including the ASan/UBSan one, not only in the clang fuzz build. Each input must
// load or throw qkv::Error; the tokenizer's and the writers' inputs must keep their fuzzers'
// invariants (fuzz/tokenize_check.h, fuzz/writers_round_trip.h).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "qkv/checkpoint.h"
#include "qkv/embeddings.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "../fuzz/tokenize_check.h"
#include "../fuzz/writers_round_trip.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

// The source tree, from this file's path (CMake compiles it by absolute path).
fs::path corpus_dir(const std::string& target) {
  return fs::path(__FILE__).parent_path().parent_path() / "fuzz" / "corpus" / target;
}

// Calls `load` on every file of the target's corpus; returns how many loaded and were refused.
template <class F>
std::pair<int, int> replay(const std::string& target, F load) {
  const fs::path dir = corpus_dir(target);
  EXPECT_TRUE(fs::is_directory(dir)) << dir;
  int loaded = 0, refused = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    try {
      load(e.path().string());
      ++loaded;
    } catch (const Error&) {
      ++refused;
    }
  }
  std::printf("%s: %d inputs loaded, %d refused with qkv::Error\n", target.c_str(), loaded, refused);
  return {loaded, refused};
}

TEST(FuzzCorpus, NpyInputsLoadOrAreRefused) {
  const auto [loaded, refused] = replay("npy", [](const std::string& p) { load_npy<double>(p); });
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 0);  // the big-endian seed
}

TEST(FuzzCorpus, SafetensorsInputsLoadOrAreRefused) {
  const auto [loaded, refused] = replay("safetensors", [](const std::string& p) { load_safetensors(p); });
  EXPECT_GT(loaded + refused, 0);
}

TEST(FuzzCorpus, EmbeddingInputsLoadOrAreRefused) {
  const std::pair<const char*, EmbeddingFormat> targets[] = {{"glove", EmbeddingFormat::glove},
                                                             {"word2vec_text", EmbeddingFormat::word2vec_text},
                                                             {"word2vec_binary", EmbeddingFormat::word2vec_binary}};
  for (const auto& [target, format] : targets) {
    const auto [loaded, refused] = replay(target, [f = format](const std::string& p) { Embeddings::load(p, f); });
    EXPECT_GT(loaded, 0) << target;
  }
}

TEST(FuzzCorpus, CheckpointInputsLoadOrAreRefused) {
  const auto [loaded, refused] = replay("checkpoint", [](const std::string& p) { load_checkpoint(p); });
  EXPECT_GT(loaded, 0);
}

std::string file_bytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(FuzzCorpus, TokenizeInputs) {
  int inputs = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(corpus_dir("tokenize"))) {
    const char* broken = fuzz::tokenize_broken(file_bytes(e.path()));
    EXPECT_EQ(broken, nullptr) << e.path() << ": " << broken;
    ++inputs;
  }
  EXPECT_GT(inputs, 0);
}

TEST(FuzzCorpus, WritersRoundTrip) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("qkv_writers_{}", ::getpid());
  fs::create_directories(dir);
  int inputs = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(corpus_dir("writers"))) {
    const std::string bytes = file_bytes(e.path());
    try {
      fuzz::writers::run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), (dir / "a.npy").string(),
                         (dir / "a.safetensors").string());
    } catch (const fuzz::writers::Broken& b) {
      ADD_FAILURE() << e.path() << ": " << b.what;
    }
    ++inputs;
  }
  fs::remove_all(dir);
  EXPECT_GT(inputs, 0);
}

}  // namespace
}  // namespace qkv
