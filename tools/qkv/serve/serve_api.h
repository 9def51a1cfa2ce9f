// The JSON API of `qkv serve`, apart from HTTP: the server holds the embeddings and the layers it
// was started with; a request only picks among them (never a file name) and sets the toggles the
// tutorials discuss. Every answer is computed by the same functions as `qkv explain --json` and
// `qkv compare --json`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cli_util.h"
#include "qkv/embeddings.h"
#include "qkv/layer.h"

namespace qkv::cli {

// Limits of one request. A sentence of more tokens than kServeMaxTokens is refused (the page's
// heatmaps stay readable up to there); bodies beyond kServeMaxBodyBytes are refused by the server
// before they are parsed.
inline constexpr int64_t kServeMaxTokens = 64;
inline constexpr std::size_t kServeMaxSentenceBytes = 2048;
inline constexpr std::size_t kServeMaxBodyBytes = 8192;

// A request the client got wrong: answered with HTTP 400 and {"error": message}.
class BadRequest : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ServeApi {
 public:
  // Loads the embeddings and builds the start-up layer (`args` as `qkv explain` reads them);
  // throws qkv::Error as `qkv explain` would.
  explicit ServeApi(SentenceArgs args);

  // GET /api/config: the layers to choose from, the limits, the vocabulary's name and size, and
  // oov: --oov's setting ("error", "zero" or "skip"), what became of an answer's missing words.
  std::string config_json() const;
  // POST /api/explain {sentence, layer: "default" | "parameter-free" | "random", seed, scaled,
  // positions, causal}: {options, layer, missing, explanation} where explanation is `qkv explain
  // --json`'s object without the weight matrices (w_q, w_k, w_v, w_o, x: the page never shows them)
  // and missing lists the sentence's words not in the vocabulary, in order, repeats included
  // (given zero vectors or skipped as oov says; always empty for "error", which refuses them).
  // Throws BadRequest for a malformed body or a refused sentence (its message is the CLI's).
  std::string explain_json(const std::string& body) const;
  // POST /api/compare {word, sentences: [a, b], layer, seed, positions}: `qkv compare --json`'s
  // object, each of its sentences with its missing words as in explain_json.
  std::string compare_json(const std::string& body) const;

 private:
  struct Choice;
  Choice choose(const std::string& layer, uint64_t seed, bool positions) const;

  SentenceArgs args_;
  Embeddings embeddings_;
  std::shared_ptr<const MultiHeadAttention> default_layer_, parameter_free_layer_;
  std::string default_label_, parameter_free_label_;
};

}  // namespace qkv::cli
