// Loading GloVe text, word2vec text and word2vec binary: values exact, formats detected, and
// every malformed or oversized file refused with the file and line.
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "io_test_util.h"
#include "qkv/embeddings.h"
#include "qkv/interrupt.h"
#include "sanitizers.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::expect_error;
using test::TempDir;
using test::write_raw;

struct Vocab {
  std::vector<std::string> words;
  Tensor<float> matrix;
};

Vocab random_vocab(test::Rng& rng, int64_t v, int64_t e) {
  Vocab out{{}, rng.normal32({v, e})};
  for (int64_t i = 0; i < v; ++i) {
    std::string w;
    for (int64_t k = rng.uniform_int(1, 9); k > 0; --k) w += static_cast<char>('a' + rng.uniform_int(0, 25));
    out.words.push_back(w + std::to_string(i));
  }
  out.words[0] = "caf\xc3\xa9";  // UTF-8 survives
  return out;
}

std::string text_rows(const Vocab& v) {
  std::string s;
  const int64_t e = v.matrix.dim(1);
  for (std::size_t i = 0; i < v.words.size(); ++i) {
    s += v.words[i];
    for (int64_t j = 0; j < e; ++j) s += fmt::format(" {:.9g}", v.matrix[static_cast<int64_t>(i) * e + j]);
    s += '\n';
  }
  return s;
}

std::string binary_file(const Vocab& v, bool newline_after_vector) {
  const int64_t e = v.matrix.dim(1);
  std::string s = fmt::format("{} {}\n", v.words.size(), e);
  for (std::size_t i = 0; i < v.words.size(); ++i) {
    s += v.words[i] + " ";
    s.append(reinterpret_cast<const char*>(v.matrix.data() + i * e), static_cast<std::size_t>(e) * 4);
    if (newline_after_vector) s += '\n';
  }
  return s;
}

void expect_same(const Embeddings& got, const Vocab& want) {
  ASSERT_EQ(got.size(), static_cast<int64_t>(want.words.size()));
  ASSERT_EQ(got.dim(), want.matrix.dim(1));
  for (std::size_t i = 0; i < want.words.size(); ++i) ASSERT_EQ(got.word(static_cast<int64_t>(i)), want.words[i]);
  EXPECT_EQ(std::memcmp(got.matrix().data(), want.matrix.data(), sizeof(float) * want.matrix.numel()), 0);
}

TEST(Embeddings, EachFormatLoadsExactlyAndIsDetected) {
  test::Rng rng("Embeddings.Formats");
  TempDir dir;
  for (int64_t e : {1, 3, 40}) {
    SCOPED_TRACE(e);
    Vocab v = random_vocab(rng, rng.uniform_int(1, 60), e);
    write_raw(dir.file("g.txt"), text_rows(v));
    write_raw(dir.file("w.txt"), fmt::format("{} {}\n", v.words.size(), e) + text_rows(v));
    write_raw(dir.file("w.bin"), binary_file(v, true));
    write_raw(dir.file("w2.bin"), binary_file(v, false));
    expect_same(Embeddings::load(dir.file("g.txt")), v);
    expect_same(Embeddings::load(dir.file("g.txt"), EmbeddingFormat::glove), v);
    expect_same(Embeddings::load(dir.file("w.txt")), v);
    expect_same(Embeddings::load(dir.file("w.txt"), EmbeddingFormat::word2vec_text), v);
    expect_same(Embeddings::load(dir.file("w2.bin"), EmbeddingFormat::word2vec_binary), v);
    expect_same(Embeddings::load(dir.file("w.bin"), EmbeddingFormat::word2vec_binary), v);
    if (e > 1) {  // at width 1 four raw bytes could pass for text; the format can then be named
      expect_same(Embeddings::load(dir.file("w.bin")), v);
      expect_same(Embeddings::load(dir.file("w2.bin")), v);
    }
  }
}

// A first vector whose bytes start with printable ones and a '\n' (0x0A) once passed for a text
// row ("A") under automatic detection; random vectors hit that in about 1 file in 400
// (test_py_embeddings.py, 2026-11-21). Every printable byte before the '\n' is tried.
TEST(Embeddings, BinaryFirstVectorHoldingANewlineIsDetectedAsBinary) {
  test::Rng rng("Embeddings.BinaryNewline");
  TempDir dir;
  for (int64_t e : {2, 5, 40}) {
    for (int c = 0x21; c < 0x7f; ++c) {
      SCOPED_TRACE(fmt::format("dim {} first bytes 0x{:02x} 0x0a", e, c));
      Vocab v = random_vocab(rng, rng.uniform_int(1, 8), e);
      const uint8_t first[4] = {static_cast<uint8_t>(c), 0x0a, 0x20, 0x3f};  // about 0.63
      std::memcpy(v.matrix.data(), first, sizeof first);
      write_raw(dir.file("nl.bin"), binary_file(v, c % 2 == 0));
      expect_same(Embeddings::load(dir.file("nl.bin")), v);
    }
  }
}

// The other side of that rule: a word2vec text row whose values do not parse ("0,1" with a decimal
// comma, "1.5abc") but whose bytes happen to line up as a binary row (3 dims of 4-byte numbers)
// loaded as binary, values like 1.5e-19, without an error (found by running gensim's format tests
// against qkv). A row printable across the whole would-be vector is text: its error is reported.
TEST(Embeddings, TextRowsThatDoNotParseAreNotReadAsBinary) {
  TempDir dir;
  for (const auto& [body, bad] :
       {std::pair{"katze 0,1 0,2 0,3\nhund 0,4 0,5 0,6\n", "(\"0,1\") is not a number"},
        std::pair{"katze 1.5abc 0.2 0.3\nhund 0.4 0.5 0.6\n", "(\"1.5abc\") is not a number"},
        std::pair{"katze 0x1p3 1.0 2.0\nhund 0.4 0.5 0.6\n", "(\"0x1p3\") is not a number"}}) {
    write_raw(dir.file("w.txt"), std::string("2 3\n") + body);
    expect_error([&] { Embeddings::load(dir.file("w.txt")); }, {"w.txt: line 2: value 1 of \"katze\"", bad});
  }
}

// A stop request (Ctrl-C in Python) ends a load between blocks of the file, the first included,
// with Interrupted; the same file loads without one.
TEST(Embeddings, AStopRequestEndsALoad) {
  TempDir dir;
  write_raw(dir.file("w.txt"), "katze 0.1 0.2 0.3\nhund 0.4 0.5 0.6\n");
  {
    InterruptScope stop([](void*) { return true; }, nullptr);
    std::this_thread::sleep_for(InterruptScope::kPollInterval + std::chrono::milliseconds(5));  // the poll is due
    EXPECT_THROW(Embeddings::load(dir.file("w.txt")), Interrupted);
  }
  EXPECT_EQ(Embeddings::load(dir.file("w.txt")).size(), 2);
}

// A binary file whose words start after '\n's (a blank line after the header; gensim's
// test_load_word2vec_format_space_stripping) loaded only with the format named: automatic
// detection saw the blank line as a text row.
TEST(Embeddings, BinaryWordsAfterBlankLinesAreDetectedAsBinary) {
  TempDir dir;
  auto f32 = [](std::initializer_list<float> x) {
    std::string out(x.size() * 4, '\0');
    std::memcpy(out.data(), std::data(x), out.size());
    return out;
  };
  write_raw(dir.file("sp.bin"),
            "3 3\n\nabc " + f32({1, 2, 3}) + "cdefdg " + f32({4, 5, 6}) + "\n\ndef " + f32({7, 8, 9}));
  const Embeddings emb = Embeddings::load(dir.file("sp.bin"));
  ASSERT_EQ(emb.size(), 3);
  EXPECT_EQ(emb.find("cdefdg"), 1);
  EXPECT_EQ(emb.vector(2)[2], 9.0f);
}

TEST(Embeddings, LookupIsExactThenLowercaseAndDuplicatesKeepTheFirst) {
  TempDir dir;
  write_raw(dir.file("g.txt"), "the 1 2\nBank 3 4\nthe 5 6\nbank 7 8\r\n\n  \nParis 9 10\nPARIS 11 12\n");
  Embeddings emb = Embeddings::load(dir.file("g.txt"));
  EXPECT_EQ(emb.size(), 6);
  EXPECT_EQ(emb.find("the"), 0);
  EXPECT_EQ(emb.find("THE"), 0);
  EXPECT_EQ(emb.find("Bank"), 1);
  EXPECT_EQ(emb.find("bank"), 3);
  EXPECT_EQ(emb.find("BANK"), 3);
  EXPECT_EQ(emb.find("river"), -1);
  EXPECT_EQ(emb.vector(3)[1], 8.0f);
  EXPECT_EQ(emb.vector(2)[0], 5.0f);
  EXPECT_EQ(emb.find("PARIS"), 5);
  EXPECT_EQ(emb.find("paris"), 4);  // no exact match: the first word equal ignoring case
  EXPECT_EQ(emb.find("pArIs"), 4);
  expect_error([&] { emb.vector(6); }, {"word index 6 is outside the vocabulary of 6 words"});
  expect_error([&] { emb.vector(-1); }, {"word index -1 is outside"});
  Embeddings moved = std::move(emb);
  EXPECT_EQ(moved.find("Bank"), 1);  // the indexes survive a move
  EXPECT_EQ(moved.find("paris"), 4);
}

TEST(Embeddings, GloveWordsWithSpacesAndOtherTextVariants) {
  TempDir dir;
  // Underflow however long the number: 1e-50, and 1e-200 written out in full.
  write_raw(dir.file("g.txt"),
            ". . . 0.5 -1e-3\nat\tname@domain.com +2 1E2\r\nx 1e-50 3\ny 1 0." + std::string(199, '0') + "1\n");
  Embeddings emb = Embeddings::load(dir.file("g.txt"));
  ASSERT_EQ(emb.dim(), 2);
  EXPECT_EQ(emb.word(0), ". . .");
  EXPECT_EQ(emb.vector(0)[1], -1e-3f);
  EXPECT_EQ(emb.word(1), "at\tname@domain.com");
  EXPECT_EQ(emb.vector(1)[0], 2.0f);
  EXPECT_EQ(emb.vector(1)[1], 100.0f);
  EXPECT_EQ(emb.vector(2)[0], 0.0f);  // underflow to zero is not an error
  EXPECT_EQ(emb.vector(3)[1], 0.0f);
}

TEST(Embeddings, ConstructorChecksShapeAndValues) {
  Tensor<float> m({2, 3});
  expect_error([&] { Embeddings({"a"}, m.clone()); }, {"1 words but the matrix has shape [2, 3]"});
  m[4] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { Embeddings({"a", "b"}, m.clone()); }, {"value 2 of word \"b\" is nan"});
}

struct BadFile {
  std::string name, bytes;
  std::vector<std::string> message;
  EmbeddingFormat format = EmbeddingFormat::automatic;
};

TEST(Embeddings, MalformedTextIsRefusedWithFileAndLine) {
  TempDir dir;
  std::string rows;
  for (int i = 0; i < 16; ++i) rows += fmt::format("w{} 0.5 1.5 -2.5\n", i);
  std::vector<BadFile> cases = {
      {"ragged", rows + "w16 1 2\n", {"line 17: expected 3 values, found 2"}},
      {"extra", "a 1 2 3\nb 1 2 3 4\n", {"line 2: expected 3 values, found 4"}},
      {"no_values", "lonely\n", {"line 1: no vector values after the word"}},
      {"letters", "a 1 2 3\nb 1 x 3\n", {"line 2: value 2 of \"b\" (\"x\") is not a number"}},
      {"glued", "a 1 2 3\nb 1 2 3.5.5\n", {"line 2: value 3 of \"b\" (\"3.5.5\") is not a number"}},
      {"nan", "a 1 2 3\n\nb 1 nan 3\n", {"line 3: value 2 of \"b\" is \"nan\"; embeddings must be finite"}},
      {"inf", "a 1 2 -inf\n", {"line 1: value 3 of \"a\" is \"-inf\"; embeddings must be finite"}},
      {"range", "a 1 2 1e50\n", {"line 1: value 3 of \"a\" (\"1e50\") is out of the float32 range"}},
      {"empty", "", {"the file is empty"}},
      {"blank", "\n \n\t\n", {"the vocabulary is empty"}},
      {"w2v_more", "5 3\na 1 2 3\nb 1 2 3\n", {"the header declares 5 words but the file has 2 rows"}},
      {"w2v_fewer", "1 3\na 1 2 3\nb 1 2 3\n", {"the header declares 1 words but the file has 2 rows"}},
      {"w2v_zero", "0 3\n", {"line 1: the header declares an empty vocabulary"}},
      {"w2v_dim0", "2 0\n", {"line 1: the header declares vectors of 0 dimensions"}},
      {"w2v_ragged", "2 3\na 1 2 3\nb 1 2\n", {"line 3: expected 3 values, found 2"}},
      {"w2v_huge_rows", "1000000000000 3\na 1 2 3\n", {"declares 1000000000000 words but the file has 1 rows"}},
      {"w2v_huge_dim", "1 1000000000\na 1 2 3\n", {"1 rows of 1000000000 values need at least 2000000001 bytes"}},
      {"w2v_overflow",
       "99999999999999999999999 3\na 1 2 3\n",
       {"line 1: the header declares 99999999999999999999999 words of 3 dimensions, more than any file holds"}},
      {"w2v_overflow_dim", "2 9223372036854775807\na 1 2 3\n", {"declares 2 words of 9223372036854775807 dimensions"}},
      // Underflow reads as zero however the number is written; only overflow is out of range.
      {"range_long", "a 1 2 1" + std::string(200, '0') + "\n", {"line 1: value 3 of \"a\" (\"1000"}},
      {"not_w2v", "a 1 2 3\n", {"line 1: expected a word2vec header"}, EmbeddingFormat::word2vec_text},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = dir.file(c.name + ".txt");
    write_raw(path, c.bytes);
    std::vector<std::string> parts = c.message;
    parts.push_back(path);
    expect_error([&] { Embeddings::load(path, c.format); }, parts);
  }
  expect_error([&] { Embeddings::load(dir.file("missing.txt")); }, {dir.file("missing.txt"), "No such file"});
  expect_error([&] { Embeddings::load(dir.path()); }, {dir.path(), "is a directory"});
}

// A huge GloVe width on the first line cannot make the loader allocate more than the file could hold.
TEST(Embeddings, GloveRowsTimesWidthBeyondTheFileIsRefused) {
  TempDir dir;
  std::string first = "w";
  for (int i = 0; i < 3000; ++i) first += " 1";
  std::string body = first + "\n";
  for (int i = 0; i < 3000; ++i) body += "x\n";
  write_raw(dir.file("g.txt"), body);
  expect_error([&] { Embeddings::load(dir.file("g.txt")); }, {"3001 rows of 3000 values need at least"});
}

TEST(Embeddings, MalformedBinaryIsRefusedWithTheEntry) {
  test::Rng rng("Embeddings.Binary");
  TempDir dir;
  Vocab v = random_vocab(rng, 5, 4);
  v.words[2] = "third";
  v.words[4] = std::string(60, 'z');
  const std::string good = binary_file(v, true);
  std::string nan_file = good;
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::size_t third = good.find("third ") + 6;
  std::memcpy(nan_file.data() + third + 4, &nan, 4);
  std::vector<BadFile> cases = {
      {"truncated",
       good.substr(0, good.size() - 7),
       {"word 5 of 5", "truncated word2vec binary file: the vector needs 16 bytes but 10 remain"}},
      {"inside_word", good.substr(0, good.find(v.words[4]) + 30), {"word 5 of 5", "it ends inside the word"}},
      {"huge_rows",
       "1000000000000 4\n" + good.substr(good.find('\n') + 1),
       {"declares 1000000000000 words of 4 floats (at least 18000000000000 bytes)"}},
      {"huge_dim", "5 1000000000\n" + good.substr(good.find('\n') + 1), {"declares 5 words of 1000000000 floats"}},
      {"trailing", good + "extra 12345678901234567", {"bytes of data follow the 5 words the header declares"}},
      {"nan", nan_file, {"word 3 of 5 (\"third\"", "value 2 is nan"}},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = dir.file(c.name + ".bin");
    write_raw(path, c.bytes);
    std::vector<std::string> parts = c.message;
    parts.push_back(path);
    expect_error([&] { Embeddings::load(path, EmbeddingFormat::word2vec_binary); }, parts);
  }
}

TEST(Embeddings, CorruptedFilesNeverCrash) {
  test::Rng rng("Embeddings.Corrupted");
  TempDir dir("/dev/shm");
  Vocab v = random_vocab(rng, 6, 3);
  std::string path = dir.file("c");
  for (const std::string& good : {binary_file(v, true), fmt::format("6 3\n") + text_rows(v), text_rows(v)}) {
    auto attempt = [&](const std::string& bytes) {
      write_raw(path, bytes);
      try {
        Embeddings::load(path);
      } catch (const Error&) {
      }
    };
    for (std::size_t n = 0; n < good.size(); n += 3) attempt(good.substr(0, n));
    for (int trial = 0; trial < 200; ++trial) {
      std::string bytes = good;
      for (int k = 0, flips = static_cast<int>(rng.uniform_int(1, 3)); k < flips; ++k)
        bytes[static_cast<std::size_t>(rng.uniform_int(0, static_cast<int64_t>(good.size()) - 1))] =
            static_cast<char>(rng.uniform_int(0, 255));
      attempt(bytes);
    }
  }
}

// Detection and the parsers read at most kMaxEmbeddingLineBytes per line or binary word, so a
// 2 TB file without newlines (sparse: zeros) is refused at once instead of scanned whole (before
// the bound, a word2vec header followed by zeros took 14 s per 4 GiB: about 2 hours for 2 TB).
TEST(Embeddings, SparseTwoTerabyteFilesAreRefusedWithinSeconds) {
#ifdef QKV_TEST_UNDER_TSAN
  // TSan reserves most of the address space for its shadow, so mapping 2 TB fails with ENOMEM
  // ("cannot map ...") before the bound this test is about is reached; the ASan and plain builds
  // run it.
  GTEST_SKIP() << "no room to map 2 TB under ThreadSanitizer";
#endif
  TempDir dir;
  struct Case {
    std::string name, head;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"w2v_zeros", "1000 300\n", {"word 1 of 1000", "no space within 1048576 bytes (1 MiB) to end the word"}},
      {"w2v_one_row", "1000 300\nw ", {"word 2 of 1000", "no space within 1048576 bytes (1 MiB) to end the word"}},
      {"glove", "the 0.1 0.2\n", {"line 2 has no newline within 1048576 bytes (1 MiB"}},
      {"zeros", "", {"line 1 has no newline within 1048576 bytes (1 MiB"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file(c.name);
    write_raw(path, c.head);
    ASSERT_EQ(::truncate(path.c_str(), off_t{1} << 41), 0) << path;
    std::vector<std::string> parts = c.message;
    parts.push_back(path);
    const auto start = std::chrono::steady_clock::now();
    expect_error([&] { Embeddings::load(path); }, parts);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 2.0) << "detection and parsing must not scan the whole 2 TB";
  }
}

// A text line of exactly kMaxEmbeddingLineBytes (before its newline) loads exactly; one more byte
// is refused naming the line, in GloVe and word2vec text.
TEST(Embeddings, TextLinesUpToOneMebibyteLoadAndLongerOnesAreRefused) {
  test::Rng rng("Embeddings.LongLines");
  TempDir dir;
  Vocab v = random_vocab(rng, 2, 60000);  // at most 16 characters per value: under 1 MiB a row
  const std::string rows = text_rows(v);
  std::string first = rows.substr(0, rows.find('\n'));
  ASSERT_LT(first.size(), kMaxEmbeddingLineBytes);
  first.append(kMaxEmbeddingLineBytes - first.size(), ' ');  // trailing blanks are allowed
  const std::string second = rows.substr(rows.find('\n') + 1);
  write_raw(dir.file("max.txt"), first + "\n" + second);
  expect_same(Embeddings::load(dir.file("max.txt")), v);
  write_raw(dir.file("max_w2v.txt"), "2 60000\n" + first + "\n" + second);
  expect_same(Embeddings::load(dir.file("max_w2v.txt")), v);

  write_raw(dir.file("long.txt"), first + " \n" + second);
  expect_error([&] { Embeddings::load(dir.file("long.txt")); },
               {dir.file("long.txt"), "line 1 has no newline within 1048576 bytes"});
  write_raw(dir.file("long_w2v.txt"), "2 60000\n" + first + " \n" + second);
  expect_error([&] { Embeddings::load(dir.file("long_w2v.txt")); },
               {dir.file("long_w2v.txt"), "line 2 has no newline within 1048576 bytes"});
}

// Not run by the suite (disabled): the load-time and memory measurement on a large file, e.g.
//   scripts/make_glove.py /tmp/g.txt
//   QKV_EMBEDDINGS_BENCH=/tmp/g.txt /usr/bin/time -v qkv_tests --gtest_also_run_disabled_tests
//       --gtest_filter='*DISABLED_LoadTime*'
TEST(Embeddings, DISABLED_LoadTimeAndPeakMemory) {
  const char* path = std::getenv("QKV_EMBEDDINGS_BENCH");
  if (path == nullptr) GTEST_SKIP() << "set QKV_EMBEDDINGS_BENCH to an embeddings file";
  struct rusage before {
  }, after{};
  ::getrusage(RUSAGE_SELF, &before);
  auto start = std::chrono::steady_clock::now();
  Embeddings emb = Embeddings::load(path);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::getrusage(RUSAGE_SELF, &after);
  double matrix_mb = static_cast<double>(emb.matrix().numel()) * 4 / (1 << 20);
  std::printf("loaded %lld words x %lld dims in %.2f s; matrix %.0f MiB; peak RSS %.0f MiB (%.0f MiB before loading)\n",
              static_cast<long long>(emb.size()), static_cast<long long>(emb.dim()), seconds, matrix_mb,
              after.ru_maxrss / 1024.0, before.ru_maxrss / 1024.0);
  EXPECT_GT(emb.size(), 0);
}

}  // namespace
}  // namespace qkv
