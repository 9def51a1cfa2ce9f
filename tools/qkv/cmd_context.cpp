// `qkv context`: one contextual vector per token of a sentence (static embeddings in, the
// attention layer's output out), as a table, JSON or .npy.
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_html.h"
#include "cli_util.h"
#include "commands.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv::cli {
namespace {

struct ContextArgs {
  std::string sentence;
  SentenceArgs sentence_args;
  std::string format = "table";
  std::string out;
  int precision = 6;
  std::string html;  // the page of the steps and the contextual vectors, instead of the text
  ColorScale color_scale = ColorScale::absolute;
};

std::string table_text(const ContextArgs& a, const EmbeddedSentence& s, const Tensor<float>& y,
                       const std::string& layer) {
  std::string text = fmt::format("# {} contextual vectors of width {} ({})\n", y.dim(0), y.dim(1), layer);
  std::size_t width = 0;
  for (const auto& t : s.tokens) width = std::max(width, t.size());
  for (int64_t i = 0; i < y.dim(0); ++i) {
    text += fmt::format("{:<{}}", s.tokens[static_cast<std::size_t>(i)], width);
    for (int64_t j = 0; j < y.dim(1); ++j) text += fmt::format(" {: .{}f}", y.cview()(i, j) + 0.0f, a.precision);
    text += "\n";
  }
  return text;
}

std::string json_text(const ContextArgs& a, const EmbeddedSentence& s, const Tensor<float>& y,
                      const std::string& layer) {
  nlohmann::json vectors = nlohmann::json::array();
  for (int64_t i = 0; i < y.dim(0); ++i) {
    nlohmann::json row = nlohmann::json::array();
    for (int64_t j = 0; j < y.dim(1); ++j) row.push_back(static_cast<double>(y.cview()(i, j)));
    vectors.push_back(std::move(row));
  }
  const nlohmann::json j = {{"sentence", a.sentence}, {"tokens", s.tokens}, {"missing", s.missing},
                            {"layer", layer},         {"dim", y.dim(1)},    {"vectors", std::move(vectors)}};
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

int run_context(const ContextArgs& a) {
  check_output_paths({{"--out", a.out}, {"--html", a.html}}, sentence_inputs(a.sentence_args));
  const SentenceArgs& sa = a.sentence_args;
  const Embeddings embeddings = load_embeddings(sa);
  const EmbeddedSentence s = embed(embeddings, a.sentence, sa);
  note_missing(s.missing, sa);
  const MultiHeadAttention layer = make_layer(sa, embeddings.dim());
  const Tensor<float> y = layer.forward(s.x.cview());
  check_finite(y.cview(), "contextual vectors (the layer overflowed float32)");
  const std::string description = describe_layer(sa, layer);

  const auto bytes = [&] {
    return a.format == "npy"    ? npy_bytes<float>(y.cview())
           : a.format == "json" ? json_text(a, s, y, description)
                                : table_text(a, s, y, description);
  };
  OutputFiles pictures, outputs;
  if (!a.html.empty()) {
    const std::string title = fmt::format("Contextual vectors of \"{}\"", a.sentence);
    const std::string source =
        fmt::format("embeddings from {} (width {}); {}", file_name(sa.embeddings), embeddings.dim(), description);
    pictures.emplace_back(a.html, context_page(s, layer, title, source, page_options(sa, s, a.color_scale)));
  }
  if (!a.out.empty()) outputs.emplace_back(a.out, bytes());
  finish(bytes, std::move(pictures), outputs);
  return 0;
}

}  // namespace

Command add_context(CLI::App& app) {
  auto args = std::make_shared<ContextArgs>();
  CLI::App* sub = app.add_subcommand(
      "context",
      "One contextual vector per token: the sentence's static embeddings through self-attention.\n"
      "The layer is random and seeded (--seed, --heads, --dk), loaded (--weights) or parameter-free.");
  add_sentence_input(sub, sub->add_option("sentence", args->sentence, "The sentence ('-': standard input)")->required(),
                     nullptr, &args->sentence);
  add_sentence_options(sub, args->sentence_args, /*embeddings_required=*/true);
  sub->add_option("--format", args->format, "table (default), json, or npy (float32 [N, width]; needs --out)")
      ->check(CLI::IsMember({"table", "json", "npy"}));
  sub->add_option("--out", args->out, "Write to this file (atomically) instead of standard output");
  sub->add_option("--precision", args->precision, "Decimals in the table (default 6)")->check(integer_in(1, 9));
  sub->add_option("--html", args->html,
                  "Write a self-contained HTML page (the contextual vectors and every step) instead of the text; "
                  "--out F still gets the --format output");
  add_color_scale_option(sub, args->color_scale);
  sub->callback([sub, args] {
    if (args->format == "npy" && args->out.empty()) usage_error("context: --format npy needs --out F");
    if (!args->html.empty() && sub->count("--format") > 0 && args->out.empty())
      usage_error("context: --html writes a page instead of the text: give --out F for the --format " + args->format +
                  " output, or leave one out");
  });
  return {sub, [args] { return run_context(*args); }};
}

}  // namespace qkv::cli
