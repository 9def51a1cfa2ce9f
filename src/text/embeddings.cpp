// Embeddings (the vocabulary index and lookups) and embed_sentence (tokens -> X [N, E]).
#include <algorithm>
#include <cmath>
#include <unordered_set>

#include <fmt/format.h>

#include "io/mapped_file.h"
#include "qkv/embeddings.h"
#include "qkv/error.h"

namespace qkv {
namespace {

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// The first kMaxListed words, quoted, then how many more: a message stays one readable line
// (a 100,000-word input once gave a 1 MB error line).
std::string quoted_list(const std::vector<std::string>& words) {
  constexpr std::size_t kMaxListed = 20;
  std::string out;
  for (std::size_t i = 0; i < words.size() && i < kMaxListed; ++i) {
    if (!out.empty()) out += ", ";
    out += detail::quoted(words[i]);
  }
  if (words.size() > kMaxListed) out += fmt::format(" and {} more", words.size() - kMaxListed);
  return out;
}

}  // namespace

Embeddings::Embeddings(std::vector<std::string> words, Tensor<float> matrix)
    : words_(std::move(words)), matrix_(std::move(matrix)) {
  if (matrix_.rank() != 2 || matrix_.dim(0) != static_cast<int64_t>(words_.size()))
    throw Error(fmt::format("Embeddings: {} words but the matrix has shape {} (expected [{}, E])", words_.size(),
                            shape_string(matrix_.shape()), words_.size()));
  // What Embeddings::load refuses in a file (its messages name the file and line) is refused
  // here for every way in: the loader ends here too, and a vocabulary built in memory was let
  // through empty, or with vectors of no values, that no file could have given.
  if (words_.empty()) throw Error("Embeddings: the vocabulary is empty (no words)");
  const int64_t dim = matrix_.dim(1);
  if (dim == 0)
    throw Error(
        fmt::format("Embeddings: the vectors have 0 dimensions (matrix shape {})", shape_string(matrix_.shape())));
  for (int64_t i = 0; i < matrix_.numel(); ++i)
    if (!std::isfinite(matrix_[i]))
      throw Error(fmt::format("Embeddings: value {} of word {} is {}; embeddings must be finite", i % dim + 1,
                              detail::quoted(words_[static_cast<std::size_t>(i / dim)]), matrix_[i]));
  // The keys view words_'s strings; words_ is never resized after this, and moving the vector
  // keeps its elements where they are, so the views stay valid.
  index_.reserve(words_.size());
  for (std::size_t i = 0; i < words_.size(); ++i) index_.emplace(words_[i], static_cast<int64_t>(i));

  // The arena is sized first so it never reallocates under the views.
  auto has_upper = [](const std::string& w) {
    return std::any_of(w.begin(), w.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
  };
  std::size_t folded_bytes = 0;
  for (const std::string& w : words_)
    if (has_upper(w)) folded_bytes += w.size();
  folded_arena_.reserve(folded_bytes);
  for (std::size_t i = 0; i < words_.size(); ++i) {
    if (!has_upper(words_[i])) continue;
    std::size_t start = folded_arena_.size();
    std::string lower = ascii_lower(words_[i]);
    folded_arena_.insert(folded_arena_.end(), lower.begin(), lower.end());
    folded_.emplace(std::string_view(folded_arena_.data() + start, lower.size()), static_cast<int64_t>(i));
  }
}

std::span<const float> Embeddings::vector(int64_t index) const {
  if (index < 0 || index >= size())
    throw Error(fmt::format("Embeddings: word index {} is outside the vocabulary of {} words", index, size()));
  return {matrix_.data() + index * dim(), static_cast<std::size_t>(dim())};
}

int64_t Embeddings::find(std::string_view word) const {
  if (auto it = index_.find(word); it != index_.end()) return it->second;
  std::string lower = ascii_lower(word);
  if (lower != word)
    if (auto it = index_.find(lower); it != index_.end()) return it->second;
  if (auto it = folded_.find(lower); it != folded_.end()) return it->second;
  return -1;
}

EmbeddedSentence embed_sentence(const Embeddings& embeddings, std::string_view sentence, OovPolicy policy) {
  std::vector<std::string> tokens = tokenize(sentence);
  if (tokens.empty())
    throw Error(
        fmt::format("the sentence has no tokens (it is empty or only punctuation): {}", detail::quoted(sentence)));
  std::vector<int64_t> rows;
  EmbeddedSentence out;
  for (std::string& token : tokens) {
    int64_t row = embeddings.find(token);
    if (row < 0) {
      out.missing.push_back(token);
      if (policy == OovPolicy::skip) continue;
    }
    rows.push_back(row);
    out.tokens.push_back(std::move(token));
  }
  if (policy == OovPolicy::error && !out.missing.empty()) {
    std::vector<std::string> distinct;
    std::unordered_set<std::string> seen;
    for (const std::string& w : out.missing)
      if (seen.insert(w).second) distinct.push_back(w);
    throw Error(fmt::format("{} {} not in the vocabulary: {}", distinct.size(),
                            distinct.size() == 1 ? "word is" : "words are", quoted_list(distinct)));
  }
  if (rows.empty())
    throw Error(fmt::format("none of the {} tokens is in the vocabulary, so all were skipped: {}", out.missing.size(),
                            quoted_list(out.missing)));
  const int64_t n = static_cast<int64_t>(rows.size()), dim = embeddings.dim();
  out.x = Tensor<float>({n, dim}, "sentence embedding");
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0) continue;  // OovPolicy::zero: the row stays zero
    std::span<const float> v = embeddings.vector(rows[i]);
    std::copy(v.begin(), v.end(), out.x.data() + i * dim);
  }
  return out;
}

}  // namespace qkv
