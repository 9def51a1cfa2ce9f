// A UTF-8 byte-order mark at the start of an embeddings file (Windows editors write one) is skipped in
// every format: the first word is "the", not "\xEF\xBB\xBFthe", and the word2vec header parses.
#include <cstring>

#include "io_test_util.h"
#include "qkv/embeddings.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::expect_error;
using test::TempDir;
using test::write_raw;

constexpr const char* kBom = "\xEF\xBB\xBF";

std::string binary_row(const std::string& word, float a, float b) {
  std::string s = word + " ";
  s.append(reinterpret_cast<const char*>(&a), 4);
  s.append(reinterpret_cast<const char*>(&b), 4);
  return s + "\n";
}

TEST(EmbeddingsBom, SkippedInEveryFormat) {
  TempDir dir;
  const std::vector<std::pair<EmbeddingFormat, std::string>> files = {
      {EmbeddingFormat::glove, "the 1 2\nbank 3 4\n"},
      {EmbeddingFormat::word2vec_text, "2 2\nthe 1 2\nbank 3 4\n"},
      {EmbeddingFormat::word2vec_binary, "2 2\n" + binary_row("the", 1, 2) + binary_row("bank", 3, 4)},
  };
  for (const auto& [format, body] : files) {
    for (EmbeddingFormat asked : {format, EmbeddingFormat::automatic}) {
      SCOPED_TRACE(body.substr(0, 4) + (asked == EmbeddingFormat::automatic ? " (auto)" : ""));
      const std::string path = dir.file("bom.txt");
      write_raw(path, kBom + body);
      const Embeddings e = Embeddings::load(path, asked);
      ASSERT_EQ(e.size(), 2);
      EXPECT_EQ(e.word(0), "the");
      EXPECT_EQ(e.find("the"), 0);
      EXPECT_EQ(e.matrix().data()[0], 1.0f);
      EXPECT_EQ(e.matrix().data()[3], 4.0f);
    }
  }
}

TEST(EmbeddingsBom, AMarkAloneOrInsideAWordIsNotSkipped) {
  TempDir dir;
  const std::string path = dir.file("only.txt");
  write_raw(path, kBom);
  expect_error([&] { Embeddings::load(path); }, {path, "only a UTF-8 byte-order mark"});
  // Only the file's first three bytes are a mark; the same bytes later are part of a word.
  write_raw(path, std::string("a 1\n") + kBom + "b 2\n");
  const Embeddings e = Embeddings::load(path);
  EXPECT_EQ(e.word(1), std::string(kBom) + "b");
}

}  // namespace
}  // namespace qkv
