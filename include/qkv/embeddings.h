// Static word embeddings (GloVe text, word2vec text and binary), the tokenizer, and the
// out-of-vocabulary policy that turns a sentence into an embedding matrix X [N, E].
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "qkv/tensor.h"
#include "qkv/utf8.h"

namespace qkv {

enum class EmbeddingFormat { automatic, glove, word2vec_text, word2vec_binary };

// The longest text line (and word2vec binary word) Embeddings::load reads: 1 MiB. A 300-d GloVe
// or word2vec row is about 3 KB; 1 MiB holds 65536 values of 15 characters. The bound is what
// keeps a file without newlines (binary data, a sparse file of zeros) from being scanned whole.
inline constexpr std::size_t kMaxEmbeddingLineBytes = std::size_t{1} << 20;

// A vocabulary and its matrix [V, E]. Immutable after load; safe to share between threads.
class Embeddings {
 public:
  // Loads a file. automatic tells the formats apart by content: a "count dim" first line is
  // word2vec (binary if the first row's values are not printable text), anything else GloVe.
  // Throws qkv::Error naming the file and line (for binary files, the entry and byte offset) for
  // a missing file, a ragged or non-numeric row, a NaN, Inf or out-of-range value, a truncated
  // binary file or trailing data, a header whose word count differs from the rows or that
  // declares more data than the file holds, a text line or binary word longer than
  // kMaxEmbeddingLineBytes (detection reads at most that far), a matrix larger than the machine's
  // physical memory, or an empty vocabulary. The file is memory-mapped and
  // the matrix sized once from a first pass, so peak memory is about the matrix, not file plus
  // matrix. Text rows are parsed on all OpenMP threads. In GloVe files, extra leading non-numeric
  // tokens belong to the word (GloVe 840B has words such as ". . ."). Duplicates keep the first.
  // A word's bytes that are not valid UTF-8 are kept, or repaired as `invalid` says (qkv/utf8.h),
  // before duplicates are looked for; a word repaired to nothing ("ignore") stays, as "".
  static Embeddings load(const std::string& path, EmbeddingFormat format = EmbeddingFormat::automatic,
                         InvalidUtf8 invalid = InvalidUtf8::keep);

  // Builds from words and a matrix [V, E] (words.size() == V ≥ 1, E ≥ 1, every value finite;
  // qkv::Error otherwise). Duplicate words keep the first.
  Embeddings(std::vector<std::string> words, Tensor<float> matrix);

  int64_t size() const { return static_cast<int64_t>(words_.size()); }
  int64_t dim() const { return matrix_.rank() == 2 ? matrix_.dim(1) : 0; }
  const std::string& word(int64_t index) const { return words_[static_cast<std::size_t>(index)]; }
  std::span<const float> vector(int64_t index) const;
  // Index of `word`: an exact match, else its ASCII-lowercased form, else the first word equal
  // to it ignoring ASCII case (so the tokenizer's "paris" finds a cased vocabulary's "Paris");
  // -1 if absent.
  int64_t find(std::string_view word) const;
  const Tensor<float>& matrix() const { return matrix_; }

 private:
  std::vector<std::string> words_;
  std::unordered_map<std::string_view, int64_t> index_;
  // Lowercased forms of the words that contain uppercase letters (views into folded_arena_).
  std::vector<char> folded_arena_;
  std::unordered_map<std::string_view, int64_t> folded_;
  Tensor<float> matrix_;
};

// Lowercases and splits on whitespace and punctuation (ASCII punctuation separates and is
// dropped; bytes >= 0x80 are kept inside words so UTF-8 survives, except U+FEFF, a byte-order
// mark, which separates like a space). "The bank's" -> the, bank, s.
std::vector<std::string> tokenize(std::string_view sentence);

// What to do with a token that is not in the vocabulary.
enum class OovPolicy { error, zero, skip };

struct EmbeddedSentence {
  std::vector<std::string> tokens;   // the tokens kept, in order
  Tensor<float> x;                   // [N, E], one row per kept token
  std::vector<std::string> missing;  // out-of-vocabulary tokens (zeroed or skipped)
};

// Tokenizes and looks up a sentence (with Embeddings::find). error: throws qkv::Error listing
// every distinct missing word; zero: a zero row, the token listed in `missing`; skip: drops the
// token, listed in `missing`. Throws if the sentence has no tokens or none remain.
EmbeddedSentence embed_sentence(const Embeddings& embeddings, std::string_view sentence, OovPolicy policy);

}  // namespace qkv
