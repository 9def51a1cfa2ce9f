// The top-k page for long inputs and the comparison page (one word in two sentences). Both
// embed compact data and let the inline script draw the selected head and row.
#include <algorithm>

#include <fmt/format.h>

#include "qkv/error.h"
#include "qkv/render.h"
#include "render/render_util.h"

namespace qkv {
namespace {

std::string head_select(int64_t num_heads) {
  std::string out = "<label>Head <select id=\"head-select\">";
  for (int64_t h = 0; h < num_heads; ++h) out += fmt::format("<option value=\"{}\">head {}</option>", h, h + 1);
  return out + "</select></label>";
}

void check_top_k(const LongInputPage& p) {
  const TopKWeights& t = p.top;
  const auto n = static_cast<int64_t>(p.tokens.size());
  if (n == 0) throw Error("html: nothing to show: no tokens");
  if (t.rows != n || t.cols != n || t.num_heads < 1 || t.k < 1 ||
      t.index.size() != static_cast<std::size_t>(t.num_heads * t.rows * t.k) || t.weight.size() != t.index.size() ||
      t.rest.size() != static_cast<std::size_t>(t.num_heads * t.rows))
    throw Error(fmt::format("html: top-k weights of {} heads × {} rows × {} do not fit {} tokens", t.num_heads, t.rows,
                            t.k, n));
  if (!p.output.empty() && p.output.rows != n)
    throw Error(fmt::format("html: {} contextual vectors for {} tokens", p.output.rows, n));
}

void check_word(const WordInSentence& w, std::size_t heads, const char* which) {
  const auto n = static_cast<int64_t>(w.tokens.size());
  if (w.position < 0 || w.position >= n)
    throw Error(fmt::format("html: {} sentence: word position {} outside {} tokens", which, w.position, n));
  if (w.weights.size() != heads || heads == 0)
    throw Error(fmt::format("html: {} sentence has weights for {} heads, expected {}", which, w.weights.size(), heads));
  for (const auto& row : w.weights)
    if (static_cast<int64_t>(row.size()) != n)
      throw Error(fmt::format("html: {} sentence: a row of {} weights for {} tokens", which, row.size(), n));
}

std::string vector_row(const std::vector<double>& v, int precision) {
  constexpr std::size_t kMax = 24;
  std::string out = "[";
  for (std::size_t i = 0; i < std::min(v.size(), kMax); ++i) out += (i ? ", " : "") + detail::fixed(v[i], precision);
  if (v.size() > kMax) out += fmt::format(", … ({} values)", v.size());
  return out + "]";
}

std::string sentence_column(const WordInSentence& w, int which, int precision) {
  std::string out = fmt::format("<section class=\"side\" data-sentence=\"{}\"><h2>Sentence {}</h2>", which, which + 1);
  out += fmt::format("<p class=\"sentence\">{}</p>", html_escape(w.sentence));
  out += fmt::format("<p>\"{}\" is token {} of {}. Its weights over the sentence (selected head):</p>",
                     detail::bdi(w.tokens[static_cast<std::size_t>(w.position)]), w.position + 1, w.tokens.size());
  out += fmt::format("<div class=\"strip\" id=\"strip-{}\"></div><p class=\"formula\" id=\"formula-{}\"></p>", which,
                     which);
  out += detail::skipped_note(w.skipped_words, fmt::format("sentence {}", which + 1));
  out += fmt::format("<p>Static vector: <code>{}</code></p>", vector_row(w.static_vector, precision));
  out += fmt::format("<p>Contextual vector: <code>{}</code></p>", vector_row(w.contextual_vector, precision));
  return out + "</section>\n";
}

nlohmann::json word_json(const WordInSentence& w) {
  return {{"tokens", w.tokens}, {"position", w.position}, {"weights", w.weights}};
}

}  // namespace

std::string render_top_k_html(const LongInputPage& p, const HtmlOptions& options) {
  check_top_k(p);
  const TopKWeights& t = p.top;
  const int precision = std::clamp(options.precision, 1, 17);
  const std::string title =
      detail::shorten(p.title.empty() ? std::string("Self-attention: the largest weights") : p.title);
  std::string body = fmt::format("<header><h1>{}</h1>", html_escape(title));
  if (!p.source.empty()) body += fmt::format("<p class=\"source\">Inputs: {}</p>", html_escape(p.source));
  body += fmt::format(
      "<p class=\"note\" id=\"topk-note\">{} tokens is more than the {} an N×N heatmap shows, so each row lists its "
      "{} largest weights (computed one row at a time, without an N×N matrix) and the weight left over.</p>",
      p.tokens.size(), kMaxHeatmapTokens, t.k);
  body += detail::skipped_note(options.skipped_words) + "</header>\n";
  body += "<main>\n<div class=\"controls\">" + head_select(t.num_heads) +
          " <label>Query token <input id=\"query-input\" type=\"number\" min=\"1\" max=\"" + std::to_string(t.rows) +
          "\" value=\"1\"></label> of " + std::to_string(t.rows) + " <span id=\"query-token\"></span></div>\n";
  body +=
      "<section id=\"topk-section\"><h2>Top weights per query row</h2>\n"
      "<div class=\"pager\"><button id=\"prev-page\" type=\"button\">◀ previous rows</button> "
      "<span id=\"page-label\"></span> <button id=\"next-page\" type=\"button\">next rows ▶</button></div>\n"
      "<div id=\"legend\"></div>\n<div class=\"scroll tall\"><table id=\"topk-table\"></table></div></section>\n";
  if (!p.output.empty())
    body += "<section id=\"contextual\"><h2>Contextual vectors</h2>\n" +
            detail::matrix_table("output", "one contextual vector per token", p.output, p.tokens, precision,
                                 options.output_hint) +
            "</section>\n";
  body += "</main>\n";
  const nlohmann::json data = {{"kind", "topk"},           {"tokens", p.tokens}, {"precision", precision},
                               {"num_heads", t.num_heads}, {"k", t.k},           {"index", t.index},
                               {"weight", t.weight},       {"rest", t.rest}};
  return detail::page_shell(title, body, data, options.color_scale);
}

std::string render_comparison_html(const Comparison& c, const HtmlOptions& options) {
  const std::size_t heads = c.first.weights.size();
  check_word(c.first, heads, "first");
  check_word(c.second, heads, "second");
  const int precision = std::clamp(options.precision, 1, 17);
  // The heading isolates the word; the document's <title> is plain text.
  const auto heading = [](std::string_view word) { return fmt::format("\"{}\" in two sentences", word); };
  const std::string word = detail::shorten(c.word, 100);
  const std::string title = heading(word);
  std::string body = fmt::format("<header><h1>{}</h1>", heading(detail::bdi(word)));
  if (!c.layer.empty()) body += fmt::format("<p class=\"source\">Layer: {}</p>", html_escape(c.layer));
  body += fmt::format(
      "<p class=\"cosines\">Static cosine similarity: <b id=\"static-cosine\">{}</b> "
      "(a static embedding gives \"{}\" one vector everywhere). Contextual cosine similarity: "
      "<b id=\"contextual-cosine\">{}</b> (self-attention mixes in the words around it).</p></header>\n",
      detail::fixed(c.static_cosine, 6), detail::bdi(c.word), detail::fixed(c.contextual_cosine, 6));
  body += "<main>\n<div class=\"controls\">" + head_select(static_cast<int64_t>(heads)) + "</div>\n";
  body += "<div class=\"sides\">" + sentence_column(c.first, 0, precision) + sentence_column(c.second, 1, precision) +
          "</div>\n<div id=\"legend\"></div>\n<p id=\"readout\" class=\"readout\">Hover a token.</p>\n</main>\n";
  const nlohmann::json data = {{"kind", "compare"},
                               {"word", c.word},
                               {"precision", precision},
                               {"num_heads", heads},
                               {"sentences", {word_json(c.first), word_json(c.second)}}};
  return detail::page_shell(title, body, data, options.color_scale);
}

}  // namespace qkv
