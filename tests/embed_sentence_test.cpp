// tokenize() and embed_sentence(): tokens, rows equal to the vocabulary's vectors, and each
// out-of-vocabulary policy with its messages.
#include <cstring>

#include "io_test_util.h"
#include "qkv/embeddings.h"
#include "qkv/utf8.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::expect_error;
using Tokens = std::vector<std::string>;

TEST(Tokenize, LowercasesAndSplitsOnWhitespaceAndPunctuation) {
  EXPECT_EQ(tokenize("The bank's"), (Tokens{"the", "bank", "s"}));
  EXPECT_EQ(tokenize("  I went\tto the BANK,\nto deposit-money!  "),
            (Tokens{"i", "went", "to", "the", "bank", "to", "deposit", "money"}));
  EXPECT_EQ(tokenize("r2d2 (1999)...x"), (Tokens{"r2d2", "1999", "x"}));
  EXPECT_EQ(tokenize("Caf\xc3\xa9 na\xc3\xafve"),
            (Tokens{"caf\xc3\xa9", "na\xc3\xafve"}));  // UTF-8 kept, not lowercased
  EXPECT_EQ(tokenize("\xe6\x97\xa5\xe6\x9c\xac"), (Tokens{"\xe6\x97\xa5\xe6\x9c\xac"}));
  EXPECT_EQ(tokenize("a\x01"
                     "b\x7f"
                     "c"),
            (Tokens{"a", "b", "c"}));
  EXPECT_TRUE(tokenize("").empty());
  EXPECT_TRUE(tokenize(" .,;:!?'\"()[]{}<>/\\|@#$%^&*-_=+~` ").empty());
}

// A text file saved with a byte-order mark starts with U+FEFF: it must not become part of the
// first word (which would then be "missing" from every vocabulary, invisibly).
TEST(Tokenize, ByteOrderMarkSeparatesLikeASpace) {
  EXPECT_EQ(tokenize("\xEF\xBB\xBFThe bank"), (Tokens{"the", "bank"}));
  EXPECT_EQ(tokenize("the\xEF\xBB\xBFriver\xEF\xBB\xBF"), (Tokens{"the", "river"}));
  EXPECT_TRUE(tokenize("\xEF\xBB\xBF").empty());
  // Other characters of the same lead byte stay inside words; a cut-off mark is an ordinary byte.
  EXPECT_EQ(tokenize("a\xEF\xBB\xBEz"), (Tokens{"a\xEF\xBB\xBEz"}));
  EXPECT_EQ(tokenize("a\xEF\xBB"), (Tokens{"a\xEF\xBB"}));
}

Embeddings small_vocab(test::Rng& rng, int64_t dim) {
  std::vector<std::string> words = {"the", "bank", "river", "money", "caf\xc3\xa9", "Paris"};
  return Embeddings(words, rng.normal32({static_cast<int64_t>(words.size()), dim}));
}

void expect_row(const EmbeddedSentence& s, int64_t row, const Embeddings& emb, const std::string& word) {
  int64_t index = emb.find(word);
  ASSERT_GE(index, 0) << word;
  std::span<const float> v = emb.vector(index);
  EXPECT_EQ(std::memcmp(s.x.data() + row * emb.dim(), v.data(), v.size() * sizeof(float)), 0) << "row " << row;
}

TEST(EmbedSentence, RowsAreTheVocabularyVectors) {
  test::Rng rng("EmbedSentence.Rows");
  for (int64_t dim : {1, 3, 40, 111}) {
    Embeddings emb = small_vocab(rng, dim);
    EmbeddedSentence s = embed_sentence(emb, "The river BANK, the caf\xc3\xa9; PARIS.", OovPolicy::error);
    const Tokens expected = {"the", "river", "bank", "the", "caf\xc3\xa9", "paris"};
    EXPECT_EQ(s.tokens, expected);
    EXPECT_TRUE(s.missing.empty());
    ASSERT_EQ(s.x.rank(), 2);
    ASSERT_EQ(s.x.dim(0), 6);
    ASSERT_EQ(s.x.dim(1), dim);
    for (int64_t i = 0; i < 6; ++i) expect_row(s, i, emb, expected[static_cast<std::size_t>(i)]);
  }
}

TEST(EmbedSentence, ErrorPolicyListsEveryMissingWordOnce) {
  test::Rng rng("EmbedSentence.Error");
  Embeddings emb = small_vocab(rng, 3);
  expect_error([&] { embed_sentence(emb, "foo the bar, baz BAR", OovPolicy::error); },
               {"3 words are not in the vocabulary: \"foo\", \"bar\", \"baz\""});
  expect_error([&] { embed_sentence(emb, "the quux", OovPolicy::error); },
               {"1 word is not in the vocabulary: \"quux\""});
  // Many missing words: the first 20 and a count, one short line (100,000 once made a 1 MB line).
  std::string many;
  for (int i = 0; i < 1000; ++i)
    many.append("w").append(std::to_string(i)).append(" ");  // not "w" + ...: GCC 12 -Wrestrict
  try {
    embed_sentence(emb, many, OovPolicy::error);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("1000 words are not in the vocabulary: \"w0\", \"w1\","), std::string::npos) << m;
    EXPECT_NE(m.find("\"w19\" and 980 more"), std::string::npos) << m;
    EXPECT_LT(m.size(), 400u) << m;
  }
  // A long missing word is cut short in the message, never inside a UTF-8 character: the cut
  // falls on each of the three bytes of U+200B in turn, and the message stays valid UTF-8.
  for (const std::string lead : {"", "a", "ab"}) {
    std::string word = lead;
    for (int i = 0; i < 100; ++i) word += "\xE2\x80\x8B";
    try {
      embed_sentence(emb, "the " + word, OovPolicy::error);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(invalid_utf8_at(m), std::string_view::npos) << "lead '" << lead << "': " << m;
      EXPECT_NE(m.find("\"..."), std::string::npos) << m;
    }
  }
  EmbeddedSentence s = embed_sentence(emb, "the bank", OovPolicy::error);
  EXPECT_EQ(s.tokens, (Tokens{"the", "bank"}));
  EXPECT_TRUE(s.missing.empty());
  ASSERT_EQ(s.x.dim(0), 2);
  expect_row(s, 0, emb, "the");
  expect_row(s, 1, emb, "bank");
}

TEST(EmbedSentence, ZeroPolicyKeepsAZeroRowAndReportsTheWord) {
  test::Rng rng("EmbedSentence.Zero");
  Embeddings emb = small_vocab(rng, 5);
  EmbeddedSentence s = embed_sentence(emb, "the foo Paris bar foo", OovPolicy::zero);
  EXPECT_EQ(s.tokens, (Tokens{"the", "foo", "paris", "bar", "foo"}));
  EXPECT_EQ(s.missing, (Tokens{"foo", "bar", "foo"}));
  ASSERT_EQ(s.x.dim(0), 5);
  expect_row(s, 0, emb, "the");
  expect_row(s, 2, emb, "Paris");  // found through the lowercase fallback of find()
  for (int64_t row : {1, 3, 4})
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(s.x[row * 5 + j], 0.0f) << "row " << row;
  EmbeddedSentence all = embed_sentence(emb, "foo bar", OovPolicy::zero);
  EXPECT_EQ(all.x.dim(0), 2);
}

TEST(EmbedSentence, SkipPolicyDropsMissingTokens) {
  test::Rng rng("EmbedSentence.Skip");
  Embeddings emb = small_vocab(rng, 3);
  EmbeddedSentence s = embed_sentence(emb, "foo money, the bar", OovPolicy::skip);
  EXPECT_EQ(s.tokens, (Tokens{"money", "the"}));
  EXPECT_EQ(s.missing, (Tokens{"foo", "bar"}));
  ASSERT_EQ(s.x.dim(0), 2);
  expect_row(s, 0, emb, "money");
  expect_row(s, 1, emb, "the");
  expect_error([&] { embed_sentence(emb, "foo, bar!", OovPolicy::skip); },
               {"none of the 2 tokens is in the vocabulary, so all were skipped: \"foo\", \"bar\""});
}

TEST(EmbedSentence, EmptySentenceIsRefused) {
  test::Rng rng("EmbedSentence.Empty");
  Embeddings emb = small_vocab(rng, 3);
  for (OovPolicy p : {OovPolicy::error, OovPolicy::zero, OovPolicy::skip}) {
    expect_error([&] { embed_sentence(emb, "", p); }, {"the sentence has no tokens"});
    expect_error([&] { embed_sentence(emb, " ... !? ", p); }, {"the sentence has no tokens", "\" ... !? \""});
  }
}

}  // namespace
}  // namespace qkv
