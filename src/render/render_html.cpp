// The explanation page: tokens, a head/query selector, the heatmap and the weighted sum (drawn
// by the inline script from the embedded data), and every step as a labelled table.
#include <algorithm>

#include <fmt/format.h>

#include "qkv/error.h"
#include "qkv/render.h"
#include "explain/explanation_checks.h"
#include "render/render_util.h"

namespace qkv {
namespace {

using detail::matrix_table;

std::string token_list(const std::vector<std::string>& tokens) {
  std::string out = "<ol class=\"tokens\">";
  for (std::size_t i = 0; i < tokens.size(); ++i)
    out += fmt::format("<li data-i=\"{}\">{}</li>", i, html_escape(tokens[i]));
  return out + "</ol>\n";
}

std::string selectors(const std::vector<std::string>& tokens, int64_t num_heads, int64_t num_kv_heads) {
  std::string out = "<div class=\"controls\"><label>Head <select id=\"head-select\">";
  const int64_t group = num_heads / std::max<int64_t>(num_kv_heads, 1);
  for (int64_t h = 0; h < num_heads; ++h)
    out += fmt::format("<option value=\"{}\">head {}{}</option>", h, h + 1,
                       num_kv_heads == num_heads ? "" : fmt::format(" (key/value head {})", h / group + 1));
  out += "</select></label> <label>Query token <select id=\"query-select\">";
  for (std::size_t i = 0; i < tokens.size(); ++i)
    out += fmt::format("<option value=\"{}\">token {} of {}: {}</option>", i, i + 1, tokens.size(),
                       html_escape(tokens[i]));
  return out + "</select></label></div>\n";
}

// The rows and keys of a long input's close-up (the script reads it from the page's data).
constexpr int kCloseUp = 24;

std::string heatmap_section(ColorScale scale) {
  const char* colours =
      scale == ColorScale::absolute
          ? "Colours are absolute: a weight's own value from 0 (light) to 1 (dark), the same scale on "
            "every row, head and page."
          : "Colours are per row: each row from 0 (light) to its own largest weight (dark), which "
            "ranks the keys of a flat row; compare rows by their numbers, not their colours.";
  return fmt::format(
      "<section id=\"heatmap-section\"><h2>Attention weights</h2>\n"
      "<p class=\"hint\">Row <i>i</i> holds the softmax weights of query token <i>i</i> over every key token "
      "(each row sums to 1). {} Hover a cell for its exact value; click a row to choose the query.</p>\n"
      "<p class=\"hint\" id=\"heatmap-caption\">How the map stays readable: up to 48 tokens it names every token on "
      "both axes, with the margins its labels need (key labels turn upright when they are wider than a column). "
      "Longer inputs (up to {}) get a labelled close-up of the {} rows and {} keys around the chosen cell, and under "
      "it an overview of every weight, 2 to 12 pixels a cell in a scrolling box: click the overview to move the "
      "close-up, or choose a query (the close-up then centres on the key it attends to most).</p>\n"
      "<div id=\"heatmap\" class=\"heatmap-scroll\"></div>\n<div id=\"legend\"></div>\n"
      "<p id=\"readout\" class=\"readout\">Hover a cell.</p></section>\n"
      "<section id=\"decomposition\"><h2>The query's context vector: a weighted sum of value vectors</h2>\n"
      "<div id=\"sum\"></div></section>\n",
      colours, kMaxHeatmapTokens, kCloseUp, kCloseUp);
}

std::string head_steps(const Explanation& e, std::size_t h, int precision, std::string_view hint) {
  const HeadSteps& s = e.heads[h];
  std::string out = fmt::format("<section class=\"head-steps\" data-head=\"{}\"{}><h3>Head {}</h3>\n", h,
                                h == 0 ? "" : " hidden", h + 1);
  const std::vector<std::string>& t = e.tokens;
  const char* from = e.parameter_free ? "Q = X (parameter-free)" : e.x.empty() ? "given" : "Q = X·W_q";
  out += matrix_table("Q", from, s.q, t, precision, hint);
  out += matrix_table("K", e.parameter_free ? "K = X" : e.x.empty() ? "given" : "K = X·W_k", s.k, t, precision, hint);
  out += matrix_table("V", e.parameter_free ? "V = X" : e.x.empty() ? "given" : "V = X·W_v", s.v, t, precision, hint);
  out += matrix_table("raw scores", "Q·Kᵀ: row = query, column = key", s.scores, t, precision, hint, t);
  out += matrix_table("scaled scores", fmt::format("Q·Kᵀ / √d_k = Q·Kᵀ × {}", detail::fixed(s.scale, 6)),
                      s.scaled_scores, t, precision, hint, t);
  out += matrix_table("weights", "softmax of each row of the scaled scores: row = query, column = key", s.weights, t,
                      precision, hint, t);
  out += matrix_table("context", "weights·V: one context vector per token", s.context, t, precision, hint);
  return out + "</section>\n";
}

std::string steps_section(const Explanation& e, int precision, std::string_view hint) {
  std::string out = "<section id=\"steps\"><h2>Every step</h2>\n";
  if (!e.x.empty()) out += matrix_table("X", "static embeddings, one row per token", e.x, e.tokens, precision, hint);
  const std::vector<std::string> none;
  if (!e.w_q.empty()) {
    const std::string origin = e.weights.empty() ? "" : e.weights + ": ";
    out += matrix_table("W_q", origin + "query projection", e.w_q, none, precision, hint);
    out += matrix_table("W_k", origin + "key projection", e.w_k, none, precision, hint);
    out += matrix_table("W_v", origin + "value projection", e.w_v, none, precision, hint);
  }
  if (!e.b_q.empty()) out += matrix_table("b_q", "query bias", e.b_q, none, precision, hint);
  if (!e.b_k.empty()) out += matrix_table("b_k", "key bias", e.b_k, none, precision, hint);
  if (!e.b_v.empty()) out += matrix_table("b_v", "value bias", e.b_v, none, precision, hint);
  out += "<p class=\"hint\">The steps of the head chosen above:</p>\n";
  for (std::size_t h = 0; h < e.heads.size(); ++h) out += head_steps(e, h, precision, hint);
  if (e.heads.size() > 1)
    out += matrix_table("concat", "the heads' context vectors side by side", e.concat, e.tokens, precision, hint);
  if (!e.w_o.empty()) {
    out += matrix_table("W_o", "output projection", e.w_o, none, precision, hint);
    if (!e.b_o.empty()) out += matrix_table("b_o", "output bias", e.b_o, none, precision, hint);
  }
  return out + "</section>\n";
}

std::string output_section(const Explanation& e, int precision, std::string_view hint) {
  if (e.output.empty()) return {};
  const char* note = !e.w_o.empty()       ? "concat·W_o: what the layer outputs for each token"
                     : e.heads.size() > 1 ? "the heads' context vectors side by side (no W_o)"
                                          : "the context vectors (no output projection)";
  return "<section id=\"contextual\"><h2>Contextual vectors</h2>\n" +
         matrix_table("output", note, e.output, e.tokens, precision, hint) + "</section>\n";
}

void check_explanation(const Explanation& e) {
  const int64_t n = static_cast<int64_t>(e.tokens.size());
  if (n == 0) throw Error("html: nothing to show: no tokens");
  if (n > kMaxHeatmapTokens)
    throw Error(
        fmt::format("html: {} tokens is more than the {} a heatmap shows; use the top-k page", n, kMaxHeatmapTokens));
  if (e.heads.empty()) throw Error("html: the explanation has no heads");
  detail::check_explanation(e, "html");
  for (const HeadSteps& h : e.heads)
    if (h.weights.rows != n || h.v.rows != n || h.context.rows != n)
      throw Error(fmt::format("html: a head's weights are [{}, {}] for {} tokens", h.weights.rows, h.weights.cols, n));
}

}  // namespace

std::string render_explanation_html(const Explanation& e, const HtmlOptions& options) {
  check_explanation(e);
  const int precision = std::clamp(options.precision, 1, 17);
  const std::string title = detail::shorten(e.title.empty() ? std::string("Self-attention, step by step") : e.title);
  std::string body = fmt::format("<header><h1>{}</h1>", html_escape(title));
  if (!e.source.empty()) body += fmt::format("<p class=\"source\">Inputs: {}</p>", html_escape(e.source));
  body += fmt::format("<p class=\"source\">{} token{}, {} head{}, d_k = {}</p>", e.tokens.size(),
                      e.tokens.size() == 1 ? "" : "s", e.heads.size(), e.heads.size() == 1 ? "" : "s", e.d_k);
  body += detail::skipped_note(options.skipped_words) + "</header>\n";
  body += "<main>\n<section id=\"tokens-section\"><h2>Tokens</h2>" + token_list(e.tokens) + "</section>\n";
  if (options.context_first) body += output_section(e, precision, options.output_hint);
  body += selectors(e.tokens, static_cast<int64_t>(e.heads.size()), e.num_kv_heads);
  body += heatmap_section(options.color_scale);
  body += steps_section(e, precision, options.steps_hint);
  if (!options.context_first) body += output_section(e, precision, options.output_hint);
  body += "</main>\n";

  nlohmann::json heads = nlohmann::json::array();
  for (const HeadSteps& h : e.heads)
    heads.push_back({{"weights", detail::matrix_json(h.weights)},
                     {"v", detail::matrix_json(h.v)},
                     {"context", detail::matrix_json(h.context)}});
  const nlohmann::json data = {{"kind", "explain"},
                               {"tokens", e.tokens},
                               {"precision", precision},
                               {"heads", std::move(heads)},
                               {"close_up", kCloseUp}};
  return detail::page_shell(title, body, data, options.color_scale);
}

}  // namespace qkv
