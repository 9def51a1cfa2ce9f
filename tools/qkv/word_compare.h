// One word in two sentences: what `qkv compare` computes and prints as JSON, and what `qkv serve`'s
// compare mode answers with (one computation for both).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "qkv/embeddings.h"
#include "qkv/layer.h"
#include "qkv/render.h"

namespace qkv::cli {

// How many vocabulary words `nearest` lists per contextual vector.
inline constexpr int64_t kNearestWords = 5;

struct WordComparison {
  std::string word;   // the word as tokenized
  std::string layer;  // describe_layer()
  double static_cosine = 0.0, contextual_cosine = 0.0;
  std::vector<WordInSentence> sides;  // one per sentence
  // Per sentence: the vocabulary words whose vectors are closest (cosine) to the word's contextual
  // vector, best first; empty when the layer's output width differs from the embeddings' width.
  std::vector<std::vector<std::pair<std::string, double>>> nearest;
  // Per sentence: its words not in the vocabulary (given zero vectors or skipped, as --oov says), in
  // order, repeats included.
  std::vector<std::vector<std::string>> missing;
};

// `word_arg` (exactly one token, in the vocabulary) in each of `sentences` (its first occurrence)
// through `layer`. Throws qkv::Error naming the option or sentence for every refusal.
WordComparison compare_word(const std::string& word_arg, const std::vector<std::string>& sentences,
                            const SentenceArgs& args, const Embeddings& embeddings, const MultiHeadAttention& layer);

// The `qkv compare --json` object: word, sentences [{text, tokens, position, weights [H][N],
// nearest [{word, cosine}], missing}], static_cosine, contextual_cosine, layer.
nlohmann::json comparison_json(const WordComparison& c);

}  // namespace qkv::cli
