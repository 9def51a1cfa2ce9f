// `qkv serve`'s API: parse a request, pick a layer the server holds, and answer with the JSON of
// `qkv explain` / `qkv compare` (the same functions compute both).
#include "serve/serve_api.h"

#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/explain.h"
#include "word_compare.h"

namespace qkv::cli {
namespace {

using nlohmann::json;

json parse_body(const std::string& body) {
  try {
    json j = json::parse(body);
    if (!j.is_object()) throw BadRequest("the request body must be a JSON object");
    return j;
  } catch (const json::parse_error& e) {
    throw BadRequest(fmt::format("malformed JSON: {}", e.what()));
  } catch (const json::out_of_range& e) {  // a number past double's range (1e999) is the body's fault too
    throw BadRequest(fmt::format("malformed JSON: {}", e.what()));
  }
}

// Tokens are the user's raw bytes: invalid UTF-8 becomes U+FFFD rather than failing the answer.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A field of `j`: `fallback` when absent; BadRequest naming the field for another type.
bool bool_field(const json& j, const char* name, bool fallback) {
  if (!j.contains(name)) return fallback;
  if (!j[name].is_boolean()) throw BadRequest(fmt::format("\"{}\" must be true or false", name));
  return j[name].get<bool>();
}

std::string string_field(const json& j, const char* name, const char* fallback = nullptr) {
  if (!j.contains(name)) {
    if (fallback != nullptr) return fallback;
    throw BadRequest(fmt::format("\"{}\" is missing", name));
  }
  if (!j[name].is_string()) throw BadRequest(fmt::format("\"{}\" must be a string", name));
  return j[name].get<std::string>();
}

uint64_t seed_field(const json& j) {
  if (!j.contains("seed")) return 0;
  if (!j["seed"].is_number_unsigned()) throw BadRequest("\"seed\" must be an integer from 0 to 2^64 - 1");
  return j["seed"].get<uint64_t>();
}

// Refuses what the page could not show: too many bytes or tokens.
void check_sentence(const std::string& sentence, const std::string& what) {
  if (sentence.size() > kServeMaxSentenceBytes)
    throw BadRequest(fmt::format("{} is {} bytes long; the explorer takes at most {}", what, sentence.size(),
                                 kServeMaxSentenceBytes));
  const std::size_t n = tokenize(sentence).size();
  if (n > static_cast<std::size_t>(kServeMaxTokens))
    throw BadRequest(
        fmt::format("{} has {} words; the explorer shows at most {} (`qkv explain --html` takes longer "
                    "sentences)",
                    what, n, kServeMaxTokens));
}

// Error messages name the vocabulary by its full path; a client sees only the file's name.
std::string for_client(std::string message, const std::string& path) {
  const std::string name = file_name(path);
  for (std::size_t at = message.find(path); !path.empty() && at != std::string::npos;
       at = message.find(path, at + name.size()))
    message.replace(at, path.size(), name);
  return message;
}

}  // namespace

struct ServeApi::Choice {
  SentenceArgs args;
  std::shared_ptr<const MultiHeadAttention> layer;
  std::string label;  // describe_layer's text
};

ServeApi::ServeApi(SentenceArgs args) : args_(std::move(args)), embeddings_(load_embeddings(args_)) {
  default_layer_ = std::make_shared<const MultiHeadAttention>(make_layer(args_, embeddings_.dim()));
  SentenceArgs free = args_;
  free.weights.clear();
  free.parameter_free = true;
  parameter_free_layer_ = std::make_shared<const MultiHeadAttention>(make_layer(free, embeddings_.dim()));
  // Once, not per keystroke: describing the default layer looks its file up again.
  default_label_ = describe_layer(args_, *default_layer_);
  parameter_free_label_ = describe_layer(free, *parameter_free_layer_);
}

ServeApi::Choice ServeApi::choose(const std::string& layer, uint64_t seed, bool positions) const {
  Choice c{args_, nullptr, {}};
  c.args.positions = positions;
  if (layer == "default") {
    c.layer = default_layer_;
    c.label = default_label_;
  } else if (layer == "parameter-free") {
    c.args.weights.clear();
    c.args.parameter_free = true;
    c.layer = parameter_free_layer_;
    c.label = parameter_free_label_;
  } else if (layer == "random") {
    c.args.weights.clear();
    c.args.parameter_free = false;
    c.args.random = true;
    c.args.seed = seed;
    try {
      c.layer = std::make_shared<const MultiHeadAttention>(make_layer(c.args, embeddings_.dim()));
      c.label = describe_layer(c.args, *c.layer);
    } catch (const Error& e) {
      throw BadRequest(for_client(e.what(), args_.embeddings));
    }
  } else {
    throw BadRequest(fmt::format("\"layer\" must be \"default\", \"parameter-free\" or \"random\", not \"{}\"", layer));
  }
  return c;
}

std::string ServeApi::config_json() const {
  const json j = {{"embeddings", file_name(args_.embeddings)},
                  {"vocabulary", embeddings_.size()},
                  {"width", embeddings_.dim()},
                  {"positions", args_.positions},  // the page starts with --positions' setting
                  {"oov", args_.oov},              // what became of the "missing" words of an answer
                  {"layers",
                   {{{"id", "default"}, {"label", default_label_}},
                    {{"id", "parameter-free"}, {"label", parameter_free_label_}},
                    {{"id", "random"}, {"label", "random W_q, W_k, W_v (the seed you choose)"}}}},
                  {"limits",
                   {{"max_tokens", kServeMaxTokens},
                    {"max_sentence_bytes", kServeMaxSentenceBytes},
                    {"max_body_bytes", kServeMaxBodyBytes}}}};
  return dump(j);
}

std::string ServeApi::explain_json(const std::string& body) const {
  const json request = parse_body(body);
  const std::string sentence = string_field(request, "sentence");
  check_sentence(sentence, "the sentence");
  StepOptions steps;
  steps.scaled = bool_field(request, "scaled", true);
  steps.causal = bool_field(request, "causal", false);
  const bool positions = bool_field(request, "positions", args_.positions);
  const Choice c = choose(string_field(request, "layer", "default"), seed_field(request), positions);
  Explanation e;
  std::vector<std::string> missing;
  try {
    EmbeddedSentence s = embed(embeddings_, sentence, c.args);
    e = explain_layer(s.tokens, s.x.cview(), *c.layer, steps);
    missing = std::move(s.missing);
  } catch (const Error& err) {
    throw BadRequest(for_client(err.what(), args_.embeddings));
  }
  e.title = fmt::format("Self-attention for \"{}\"", sentence);
  e.style = "sentence";
  // The page shows tokens, scores, weights, values and context vectors; the rest would make every
  // keystroke's answer megabytes long.
  e.x = e.w_q = e.w_k = e.w_v = e.w_o = e.b_q = e.b_k = e.b_v = e.b_o = e.concat = e.output = Matrix{};
  for (HeadSteps& h : e.heads) h.q = h.k = Matrix{};
  const json options = {{"layer", string_field(request, "layer", "default")},
                        {"seed", c.args.seed},
                        {"scaled", steps.scaled},
                        {"positions", positions},
                        {"causal", steps.causal}};
  return fmt::format("{{\"options\":{},\"layer\":{},\"missing\":{},\"explanation\":{}}}", dump(options), dump(c.label),
                     dump(missing), explanation_to_json(e, -1));
}

std::string ServeApi::compare_json(const std::string& body) const {
  const json request = parse_body(body);
  const std::string word = string_field(request, "word");
  if (!request.contains("sentences") || !request["sentences"].is_array() || request["sentences"].size() != 2 ||
      !request["sentences"][0].is_string() || !request["sentences"][1].is_string())
    throw BadRequest("\"sentences\" must be a list of two strings");
  const std::vector<std::string> sentences = {request["sentences"][0].get<std::string>(),
                                              request["sentences"][1].get<std::string>()};
  check_sentence(sentences[0], "sentence 1");
  check_sentence(sentences[1], "sentence 2");
  if (word.size() > kServeMaxSentenceBytes) throw BadRequest("\"word\" is too long");
  const Choice c = choose(string_field(request, "layer", "default"), seed_field(request),
                          bool_field(request, "positions", args_.positions));
  try {
    return dump(comparison_json(compare_word(word, sentences, c.args, embeddings_, *c.layer)));
  } catch (const Error& err) {
    throw BadRequest(for_client(err.what(), args_.embeddings));
  }
}

}  // namespace qkv::cli
