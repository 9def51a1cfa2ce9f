// `qkv explain`: every step of self-attention, printed in the seeds' terms. No arguments: seed
// 003's worked example; --example playing-outside: seed 000's; --embeddings F "sentence": any
// sentence through a random, loaded or parameter-free layer.
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli_html.h"
#include "cli_util.h"
#include "commands.h"
#include "qkv/error.h"
#include "qkv/explain.h"
#include "qkv/render.h"

namespace qkv::cli {
namespace {

struct ExplainArgs {
  std::string sentence;
  std::string example;
  SentenceArgs sentence_args;
  bool json = false;
  int precision = 0;      // 0: 8 decimals for the seeds' examples, 4 for sentences
  std::string html, svg;  // pictures instead of text
  ColorScale color_scale = ColorScale::absolute;
};

void validate(const CLI::App* sub, ExplainArgs& a) {
  const bool has_embeddings = sub->count("--embeddings") > 0;
  const bool has_sentence = sub->get_option("sentence")->count() > 0 || sub->count("--input") > 0;
  if (has_embeddings && a.sentence_args.embeddings.empty()) usage_error("--embeddings: empty file name");
  if (!a.example.empty() && (has_embeddings || has_sentence))
    usage_error("explain: --example shows a built-in example; it takes no sentence and no --embeddings");
  if (has_embeddings && !has_sentence) usage_error("explain: --embeddings needs a sentence to explain");
  if (a.json && (!a.html.empty() || !a.svg.empty()))
    usage_error("explain: --json prints the steps; --html and --svg write pictures instead: choose one");
  if (!has_sentence && layer_options_given(sub))
    usage_error(
        "explain: --weights, --random-weights, --heads, --dk, --parameter-free and --oov apply only to a sentence");
  if (has_sentence) resolve_default_embeddings(a.sentence_args);
}

// For --html of a sentence longer than a heatmap shows, fills `long_page` with the top-k page
// instead and returns an empty explanation (its N×N matrices are never built). `options` gets the
// sentence's page options.
Explanation sentence_explanation(const ExplainArgs& a, std::string& long_page, HtmlOptions& options) {
  const SentenceArgs& s = a.sentence_args;
  const Embeddings embeddings = load_embeddings(s);
  const EmbeddedSentence sentence = embed(embeddings, a.sentence, s);
  note_missing(sentence.missing, s);
  options = page_options(s, sentence, a.color_scale);
  const MultiHeadAttention layer = make_layer(s, embeddings.dim());
  const std::string title = fmt::format("Self-attention for \"{}\"", a.sentence);
  const std::string source =
      fmt::format("embeddings from {} (width {}){}; {}", file_name(s.embeddings), embeddings.dim(),
                  s.positions ? " plus sinusoidal positional encodings" : "", describe_layer(s, layer));
  const auto n = static_cast<int64_t>(sentence.tokens.size());
  if (n > kMaxHeatmapTokens && !a.svg.empty())
    throw Error(
        fmt::format("--svg: {} tokens is more than the {} a heatmap shows (--html lists the top-{} weights "
                    "per row instead)",
                    n, kMaxHeatmapTokens, kPageTopK));
  if (n > kMaxHeatmapTokens && !a.html.empty()) {
    long_page = top_k_page(sentence, layer, title, source, /*with_output=*/false, options);
    return {};
  }
  Explanation e = explain_layer(sentence.tokens, sentence.x.cview(), layer);
  e.title = title;
  e.source = source;
  e.style = "sentence";
  if (!layer.config().parameter_free)
    e.weights = s.random ? fmt::format("random (seed {})", s.seed)
                         : fmt::format("{} ({})", default_layer(s) ? "trained" : "learned", file_name(layer_file(s)));
  return e;
}

int run_explain(const ExplainArgs& a) {
  check_output_paths({{"--html", a.html}, {"--svg", a.svg}}, sentence_inputs(a.sentence_args));
  std::string long_page;
  HtmlOptions options;
  options.color_scale = a.color_scale;
  const Explanation e = a.sentence_args.embeddings.empty() ? explain_example(a.example.empty() ? "seed-003" : a.example)
                                                           : sentence_explanation(a, long_page, options);
  OutputFiles pictures;
  if (!a.html.empty())
    pictures.emplace_back(a.html, long_page.empty() ? render_explanation_html(e, options) : long_page);
  if (!a.svg.empty()) {
    SvgOptions svg;
    svg.color_scale = a.color_scale;
    pictures.emplace_back(a.svg, render_heatmap_svg(e, svg));
  }
  const int precision = a.precision > 0 ? a.precision : (a.sentence_args.embeddings.empty() ? 8 : 4);
  finish([&] { return a.json ? explanation_to_json(e) : explanation_to_text(e, precision); }, std::move(pictures));
  return 0;
}

}  // namespace

Command add_explain(CLI::App& app) {
  auto args = std::make_shared<ExplainArgs>();
  CLI::App* sub = app.add_subcommand(
      "explain",
      "Print every step of self-attention: Q, K, V, raw scores Q·Kᵀ, scaled scores, attention weights, context "
      "vectors.\nNo arguments: seed 003's worked example. --example playing-outside: seed 000's q/k/v vectors.\n"
      "\"a sentence\": any sentence through the trained layer (or --weights F, --random-weights SEED, "
      "--parameter-free),\n"
      "its words looked up in "
      "--embeddings F (" +
          default_embeddings_rule() + ").");
  add_sentence_input(
      sub, sub->add_option("sentence", args->sentence, "The sentence to explain (its words looked up in --embeddings)"),
      nullptr, &args->sentence);
  std::string names;
  for (const std::string& n : example_names()) names += (names.empty() ? "" : ", ") + n;
  sub->add_option("--example", args->example, "A built-in worked example: " + names)
      ->check(CLI::IsMember(example_names()));
  add_sentence_options(sub, args->sentence_args, /*embeddings_required=*/false);
  sub->add_flag("--json", args->json, "Print the steps as JSON (full float64 precision)");
  sub->add_option("--precision", args->precision,
                  "Decimals shown in the text (default 8 for the examples, 4 for sentences)")
      ->check(integer_in(1, 17));
  sub->add_option("--html", args->html,
                  fmt::format("Write a self-contained HTML page (steps, heatmaps, head/query selector) instead of the "
                              "text; beyond {} tokens it lists each row's top-{} weights",
                              kMaxHeatmapTokens, kPageTopK));
  sub->add_option(
      "--svg", args->svg,
      fmt::format("Write the attention weights heatmap as a standalone SVG (up to {} tokens)", kMaxHeatmapTokens));
  add_color_scale_option(sub, args->color_scale);
  sub->callback([sub, args] { validate(sub, *args); });
  return {sub, [args] { return run_explain(*args); }};
}

}  // namespace qkv::cli
