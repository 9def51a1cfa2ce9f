// `qkv compare`: one word in two sentences (the seeds' "money bank" and "river bank"). Its
// static vector is the same in both (cosine 1); its contextual vectors differ.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_html.h"
#include "cli_util.h"
#include "commands.h"
#include "qkv/error.h"

namespace qkv::cli {
namespace {

struct CompareArgs {
  std::string word;
  std::vector<std::string> sentences;
  SentenceArgs sentence_args;
  bool json = false;
  std::string html;  // the side-by-side page, instead of the text
  ColorScale color_scale = ColorScale::absolute;
};

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

// What the word attends to in one sentence, per head ("money (token 8) 0.410, ..."), and the first
// values of its contextual vector.
std::string attends_to(const WordInSentence& w, std::size_t n) {
  constexpr std::size_t kShown = 4;
  std::string out = fmt::format("\"{}\" in sentence {}:\n", w.tokens[static_cast<std::size_t>(w.position)], n + 1);
  for (std::size_t h = 0; h < w.weights.size(); ++h) {
    std::vector<std::size_t> order(w.tokens.size());
    for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t i, std::size_t j) { return w.weights[h][i] > w.weights[h][j]; });
    out += fmt::format("  head {} attends to:", h + 1);
    for (std::size_t r = 0; r < std::min(kShown, order.size()); ++r)
      out += fmt::format(" {} (token {}) {:.3f}{}", w.tokens[order[r]], order[r] + 1, w.weights[h][order[r]],
                         r + 1 < std::min(kShown, order.size()) ? "," : "");
    out += "\n";
  }
  out += "  contextual vector: [";
  for (std::size_t d = 0; d < std::min<std::size_t>(6, w.contextual_vector.size()); ++d)
    out += fmt::format("{}{:.4f}", d ? ", " : "", w.contextual_vector[d]);
  return out +
         (w.contextual_vector.size() > 6 ? fmt::format(", ... ({} values)]\n", w.contextual_vector.size()) : "]\n");
}

struct Occurrence {
  EmbeddedSentence embedded;
  int64_t position = 0;
  Tensor<float> contextual;
};

int run_compare(const CompareArgs& a) {
  const std::vector<std::string> word_tokens = tokenize(a.word);
  if (word_tokens.size() != 1)
    throw Error(
        fmt::format("--word '{}': must be exactly one word (it tokenizes to {} tokens)", a.word, word_tokens.size()));
  const std::string& word = word_tokens[0];
  if (!a.html.empty()) check_output_path(a.html, "--html");
  const SentenceArgs& sa = a.sentence_args;
  const Embeddings embeddings = load_embeddings(sa);
  if (embeddings.find(word) < 0)
    throw Error(fmt::format("--word '{}': not in the vocabulary of {}", a.word, sa.embeddings));
  const MultiHeadAttention layer = make_layer(sa, embeddings.dim());

  std::vector<Occurrence> occ;
  for (std::size_t n = 0; n < a.sentences.size(); ++n) {
    const std::string what = fmt::format("sentence {}", n + 1);
    Occurrence o{embed(embeddings, a.sentences[n], sa, what), -1, {}};
    for (std::size_t t = 0; t < o.embedded.tokens.size() && o.position < 0; ++t)
      if (o.embedded.tokens[t] == word) o.position = static_cast<int64_t>(t);
    if (o.position < 0) throw Error(fmt::format("--word '{}': not in {} (\"{}\")", a.word, what, a.sentences[n]));
    o.contextual = layer.forward(o.embedded.x.cview());
    check_finite(o.contextual.cview(), fmt::format("contextual vectors of {} (the layer overflowed float32)", what));
    occ.push_back(std::move(o));
  }
  const double static_cos = cosine(occ[0].embedded.x.cview(), occ[0].position, occ[1].embedded.x.cview(),
                                   occ[1].position, fmt::format("static vector of '{}'", word));
  const double context_cos = cosine(occ[0].contextual.cview(), occ[0].position, occ[1].contextual.cview(),
                                    occ[1].position, fmt::format("contextual vectors of '{}'", word));
  const std::string description = describe_layer(sa, layer);
  std::vector<WordInSentence> sides;
  for (std::size_t n = 0; n < occ.size(); ++n)
    sides.push_back(
        word_in_sentence(a.sentences[n], occ[n].embedded, occ[n].position, layer, occ[n].contextual.cview(), sa));

  const auto report = [&] {
    std::string text;
    if (a.json) {
      nlohmann::json sentences = nlohmann::json::array();
      for (std::size_t n = 0; n < occ.size(); ++n)
        sentences.push_back(
            {{"text", a.sentences[n]}, {"tokens", occ[n].embedded.tokens}, {"position", occ[n].position}});
      const nlohmann::json j = {{"word", word},
                                {"sentences", std::move(sentences)},
                                {"static_cosine", static_cos},
                                {"contextual_cosine", context_cos},
                                {"layer", description}};
      text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    } else {
      text = fmt::format("The word \"{}\" in two sentences (layer: {})\n", word, description);
      for (std::size_t n = 0; n < occ.size(); ++n)
        text += fmt::format("  sentence {}: \"{}\" (token {} of {})\n", n + 1, a.sentences[n], occ[n].position + 1,
                            occ[n].embedded.tokens.size());
      text += fmt::format(
          "static cosine similarity:     {:.6f}  (a static embedding gives \"{}\" one vector in every "
          "sentence)\n",
          static_cos, word);
      text += fmt::format("contextual cosine similarity: {:.6f}  (self-attention mixes in the words around it)\n",
                          context_cos);
      for (std::size_t n = 0; n < sides.size(); ++n) text += attends_to(sides[n], n);
    }
    return text;
  };
  OutputFiles pictures;
  if (!a.html.empty()) {
    HtmlOptions options;
    options.color_scale = a.color_scale;
    pictures.emplace_back(
        a.html, render_comparison_html({word, description, static_cos, context_cos, sides[0], sides[1]}, options));
  }
  finish(report, std::move(pictures));
  return 0;
}

}  // namespace

Command add_compare(CLI::App& app) {
  auto args = std::make_shared<CompareArgs>();
  CLI::App* sub =
      app.add_subcommand("compare",
                         "Cosine similarity of one word's static and contextual vectors across two sentences,\n"
                         "e.g. --word bank \"I went to the bank to deposit money\" \"We sat by the river bank\".");
  sub->add_option("--word", args->word, "The word to compare (it must occur in both sentences)")->required();
  add_sentence_input(sub, sub->add_option("sentences", args->sentences, "The two sentences")->required()->expected(2),
                     &args->sentences, nullptr);
  add_sentence_options(sub, args->sentence_args, /*embeddings_required=*/true);
  sub->add_flag("--json", args->json, "Print the result as JSON");
  sub->add_option("--html", args->html,
                  "Write a self-contained HTML page (the word's weights side by side) instead of the text");
  add_color_scale_option(sub, args->color_scale);
  sub->callback([args] {
    if (args->json && !args->html.empty())
      usage_error("compare: --json prints the result; --html writes a page instead: choose one");
  });
  return {sub, [args] { return run_compare(*args); }};
}

}  // namespace qkv::cli
