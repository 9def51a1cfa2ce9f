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
#include "word_compare.h"

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

int run_compare(const CompareArgs& a) {
  check_output_paths({{"--html", a.html}}, sentence_inputs(a.sentence_args));
  const SentenceArgs& sa = a.sentence_args;
  const Embeddings embeddings = load_embeddings(sa);
  const MultiHeadAttention layer = make_layer(sa, embeddings.dim());
  const WordComparison c = compare_word(a.word, a.sentences, sa, embeddings, layer);
  for (std::size_t n = 0; n < c.missing.size(); ++n) note_missing(c.missing[n], sa, fmt::format("sentence {}", n + 1));
  const auto report = [&] {
    if (a.json) return comparison_json(c).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::string text = fmt::format("The word \"{}\" in two sentences (layer: {})\n", c.word, c.layer);
    for (std::size_t n = 0; n < c.sides.size(); ++n)
      text += fmt::format("  sentence {}: \"{}\" (token {} of {})\n", n + 1, a.sentences[n], c.sides[n].position + 1,
                          c.sides[n].tokens.size());
    text += fmt::format(
        "static cosine similarity:     {:.6f}  (a static embedding gives \"{}\" one vector in every "
        "sentence)\n",
        c.static_cosine, c.word);
    text += fmt::format("contextual cosine similarity: {:.6f}  (self-attention mixes in the words around it)\n",
                        c.contextual_cosine);
    for (std::size_t n = 0; n < c.sides.size(); ++n) text += attends_to(c.sides[n], n);
    return text;
  };
  OutputFiles pictures;
  if (!a.html.empty()) {
    HtmlOptions options;
    options.color_scale = a.color_scale;
    pictures.emplace_back(
        a.html, render_comparison_html({c.word, c.layer, c.static_cosine, c.contextual_cosine, c.sides[0], c.sides[1]},
                                       options));
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
