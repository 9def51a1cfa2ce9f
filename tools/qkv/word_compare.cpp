// The computation behind `qkv compare`: embed both sentences, run the layer, compare the word's
// static and contextual vectors, and find the vocabulary words nearest each contextual vector.
#include "word_compare.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cli_html.h"
#include "qkv/error.h"

namespace qkv::cli {
namespace {

double cosine(TensorView<const float> a, int64_t i, TensorView<const float> b, int64_t j, const std::string& what) {
  double dot = 0.0, na = 0.0, nb = 0.0;
  for (int64_t d = 0; d < a.dim(1); ++d) {
    const double x = a(i, d), y = b(j, d);
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  if (na == 0.0 || nb == 0.0) throw Error(fmt::format("{}: a zero vector has no cosine similarity", what));
  return dot / std::sqrt(na * nb);
}

// The kNearestWords vocabulary words closest to `v` by cosine (zero vectors skipped), best first.
std::vector<std::pair<std::string, double>> nearest_words(const Embeddings& embeddings, const std::vector<double>& v) {
  std::vector<std::pair<std::string, double>> best;
  if (static_cast<int64_t>(v.size()) != embeddings.dim()) return best;
  double nv = 0.0;
  for (double x : v) nv += x * x;
  if (nv == 0.0) return best;
  std::vector<std::pair<double, int64_t>> scored;
  scored.reserve(static_cast<std::size_t>(embeddings.size()));
  for (int64_t w = 0; w < embeddings.size(); ++w) {
    const auto row = embeddings.vector(w);
    double dot = 0.0, nw = 0.0;
    for (std::size_t d = 0; d < v.size(); ++d) {
      dot += v[d] * row[d];
      nw += static_cast<double>(row[d]) * row[d];
    }
    if (nw > 0.0) scored.emplace_back(dot / std::sqrt(nv * nw), w);
  }
  const auto k = std::min<std::size_t>(static_cast<std::size_t>(kNearestWords), scored.size());
  // Ties go to the earlier (more frequent, in frequency-sorted files) word.
  std::partial_sort(
      scored.begin(), scored.begin() + static_cast<std::ptrdiff_t>(k), scored.end(),
      [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  for (std::size_t r = 0; r < k; ++r) best.emplace_back(embeddings.word(scored[r].second), scored[r].first);
  return best;
}

}  // namespace

WordComparison compare_word(const std::string& word_arg, const std::vector<std::string>& sentences,
                            const SentenceArgs& args, const Embeddings& embeddings, const MultiHeadAttention& layer) {
  const std::vector<std::string> word_tokens = tokenize(word_arg);
  if (word_tokens.size() != 1)
    throw Error(
        fmt::format("--word '{}': must be exactly one word (it tokenizes to {} tokens)", word_arg, word_tokens.size()));
  WordComparison c;
  c.word = word_tokens[0];
  if (embeddings.find(c.word) < 0)
    throw Error(fmt::format("--word '{}': not in the vocabulary of {}", word_arg, args.embeddings));
  struct Occurrence {
    EmbeddedSentence embedded;
    int64_t position = -1;
    Tensor<float> contextual;
  };
  std::vector<Occurrence> occ;
  for (std::size_t n = 0; n < sentences.size(); ++n) {
    const std::string what = fmt::format("sentence {}", n + 1);
    Occurrence o{embed(embeddings, sentences[n], args, what), -1, {}};
    for (std::size_t t = 0; t < o.embedded.tokens.size() && o.position < 0; ++t)
      if (o.embedded.tokens[t] == c.word) o.position = static_cast<int64_t>(t);
    if (o.position < 0) throw Error(fmt::format("--word '{}': not in {} (\"{}\")", word_arg, what, sentences[n]));
    o.contextual = layer.forward(o.embedded.x.cview());
    check_finite(o.contextual.cview(), fmt::format("contextual vectors of {} (the layer overflowed float32)", what));
    occ.push_back(std::move(o));
  }
  c.static_cosine = cosine(occ[0].embedded.x.cview(), occ[0].position, occ[1].embedded.x.cview(), occ[1].position,
                           fmt::format("static vector of '{}'", c.word));
  c.contextual_cosine = cosine(occ[0].contextual.cview(), occ[0].position, occ[1].contextual.cview(), occ[1].position,
                               fmt::format("contextual vectors of '{}'", c.word));
  c.layer = describe_layer(args, layer);
  for (std::size_t n = 0; n < occ.size(); ++n) {
    c.sides.push_back(
        word_in_sentence(sentences[n], occ[n].embedded, occ[n].position, layer, occ[n].contextual.cview(), args));
    c.nearest.push_back(nearest_words(embeddings, c.sides.back().contextual_vector));
    c.missing.push_back(occ[n].embedded.missing);
  }
  return c;
}

nlohmann::json comparison_json(const WordComparison& c) {
  nlohmann::json sentences = nlohmann::json::array();
  for (std::size_t n = 0; n < c.sides.size(); ++n) {
    nlohmann::json nearest = nlohmann::json::array();
    for (const auto& [word, cos] : c.nearest[n]) nearest.push_back({{"word", word}, {"cosine", cos}});
    const WordInSentence& s = c.sides[n];
    sentences.push_back({{"text", s.sentence},
                         {"tokens", s.tokens},
                         {"position", s.position},
                         {"weights", s.weights},
                         {"nearest", std::move(nearest)},
                         {"missing", c.missing[n]}});
  }
  return {{"word", c.word},
          {"sentences", std::move(sentences)},
          {"static_cosine", c.static_cosine},
          {"contextual_cosine", c.contextual_cosine},
          {"layer", c.layer}};
}

}  // namespace qkv::cli
