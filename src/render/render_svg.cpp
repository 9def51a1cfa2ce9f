// The heatmap as a standalone SVG document (for papers and slides): one <rect> per weight, the
// exact value in data-w and a <title> tooltip, tokens on both axes and a colour scale.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "explain/explanation_checks.h"
#include "qkv/error.h"
#include "qkv/render.h"
#include "qkv/utf8.h"
#include "render/render_util.h"

namespace qkv {
namespace {

constexpr std::size_t kLabelChars = 16;  // longer tokens are cut with an ellipsis on the axes

// Valid XML text: invalid UTF-8 (by the full rule: surrogates, overlong forms and code points past
// U+10FFFF too), control characters and U+FFFE / U+FFFF (none allowed in XML 1.0) become U+FFFD,
// then markup characters are escaped. At most `max_chars` code points are kept.
std::string xml_text(std::string_view s, std::size_t max_chars = SIZE_MAX) {
  const std::string valid = repair_utf8(s, InvalidUtf8::replace);
  std::string clean;
  std::size_t chars = 0, i = 0;
  while (i < valid.size() && chars < max_chars) {
    const auto c = static_cast<unsigned char>(valid[i]);
    const std::size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;  // valid UTF-8 from here
    const std::string_view ch = std::string_view(valid).substr(i, len);
    const bool refused = (len == 1 && (c < 0x20 || c == 0x7F)) || ch == "\xEF\xBF\xBE" || ch == "\xEF\xBF\xBF";
    clean += refused ? std::string_view("\xEF\xBF\xBD") : ch;
    i += len;
    ++chars;
  }
  if (i < valid.size()) clean += "\xE2\x80\xA6";
  return html_escape(clean);
}

// A text's width in pixels at `font`, estimated on the safe side (the SVG is measured by no
// browser when it is written): Latin letters at 0.62 em (0.68 bold, DejaVu Sans's widest
// lowercase run), anything else (CJK, emoji) at a full em.
double text_width(std::string_view text, double font, bool bold = false) {
  double w = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: counted with its lead byte
    w += c < 0x80 ? (bold ? 0.68 : 0.62) : 1.0;
  }
  return w * font;
}

// The geometry of one head's panel. Every margin is what its measured labels and titles need, and
// the titles are centred on the grid unless that pushes them off the panel (a 2-token grid is
// narrower than its titles): the same rule as the page's script, which measures in the browser.
struct Layout {
  int64_t n = 0;
  double font = 11, line = 0, cell = 0, left = 0, top = 0, grid = 0, width = 0, height = 0;
  double keys_x = 0, queries_y = 0;  // centres of the axis titles
  bool labels = false, across = false, numbers = false;
};

constexpr double kPad = 6;
constexpr const char* kKeysTitle = "keys (columns): the tokens attended to";
constexpr const char* kQueriesTitle = "queries (rows): the tokens attending";

Layout layout(const Explanation& e) {
  Layout l;
  l.n = static_cast<int64_t>(e.tokens.size());
  const auto n = static_cast<double>(l.n);
  l.cell = l.n <= 12 ? 44.0 : std::clamp(std::floor(640.0 / n), 3.0, 18.0);
  l.font = l.n <= 12 ? 12.0 : std::min(l.n <= 24 ? 11.0 : 10.0, std::floor(l.cell / 1.6));
  l.labels = l.font >= 6.0;
  l.numbers = l.cell >= 30.0;
  const double title_font = 11.0;
  l.line = std::ceil(title_font * 1.4);
  double kw = 0;
  if (l.labels)
    for (const auto& t : e.tokens) kw = std::max(kw, text_width(xml_text(t, kLabelChars), l.font));
  l.across = l.labels && kw <= l.cell - 6;
  const double band = !l.labels ? 0.0 : l.across ? l.line : kw + 6;
  l.grid = l.cell * n;
  l.left = kPad + l.line + 6 + (l.labels ? kw + 6 : 0);  // query labels are no wider than key labels
  const double rows_top = kPad + 2 * l.line + 4;         // below the head's title and the keys title
  l.top = rows_top + band + 4;
  const double tk = text_width(kKeysTitle, title_font, true), tq = text_width(kQueriesTitle, title_font, true);
  l.keys_x = std::max(l.left + l.grid / 2, kPad + tk / 2);
  l.queries_y = std::max(l.top + l.grid / 2, rows_top + tq / 2);
  l.width = std::ceil(std::max(l.left + l.grid, l.keys_x + tk / 2) + kPad);
  l.height = std::ceil(std::max(l.top + l.grid, l.queries_y + tq / 2) + kPad);
  return l;
}

double shade(double w, double row_max, ColorScale scale) {
  return scale == ColorScale::row ? (row_max > 0 ? w / row_max : 0.0) : w;
}

void draw_head(std::string& out, const Explanation& e, int64_t h, const Layout& l, double x0, ColorScale scale,
               int precision) {
  const Matrix& w = e.heads[static_cast<std::size_t>(h)].weights;
  out += fmt::format("<g class=\"head\" data-head=\"{}\" transform=\"translate({:.1f},0)\">\n", h, x0);
  out += fmt::format("<text class=\"head-title\" x=\"{:.1f}\" y=\"{:.1f}\" font-weight=\"bold\">Head {}</text>\n", kPad,
                     kPad + 11, h + 1);
  out += fmt::format(
      "<text class=\"axis-title\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>\n"
      "<text class=\"axis-title\" transform=\"translate({:.1f},{:.1f}) rotate(-90)\" text-anchor=\"middle\" "
      "font-weight=\"bold\">{}</text>\n",
      l.keys_x, kPad + l.line + 11, kKeysTitle, kPad + 11, l.queries_y, kQueriesTitle);
  if (l.labels) {
    for (int64_t j = 0; j < l.n; ++j) {
      const double x = l.left + (static_cast<double>(j) + 0.5) * l.cell;
      const std::string text = xml_text(e.tokens[static_cast<std::size_t>(j)], kLabelChars);
      if (l.across)
        out += fmt::format(
            "<text class=\"key\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"{}\">{}</text>\n", x,
            l.top - 6, l.font, text);
      else
        out += fmt::format(
            "<text class=\"key\" transform=\"translate({:.1f},{:.1f}) rotate(-90)\" font-size=\"{}\">{}</text>\n",
            x + l.font * 0.35, l.top - 6, l.font, text);
    }
    for (int64_t i = 0; i < l.n; ++i)
      out += fmt::format(
          "<text class=\"query\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"{}\">{}</text>\n",
          l.left - 6, l.top + (static_cast<double>(i) + 0.5) * l.cell + l.font * 0.35, l.font,
          xml_text(e.tokens[static_cast<std::size_t>(i)], kLabelChars));
  }
  for (int64_t i = 0; i < l.n; ++i) {
    double row_max = 0;
    for (int64_t j = 0; j < l.n; ++j) row_max = std::max(row_max, w(i, j));
    for (int64_t j = 0; j < l.n; ++j) {
      const double v = w(i, j), t = shade(v, row_max, scale), x = l.left + static_cast<double>(j) * l.cell,
                   y = l.top + static_cast<double>(i) * l.cell;
      out += fmt::format(
          "<rect class=\"cell\" x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\" data-i=\"{}\" "
          "data-j=\"{}\" data-w=\"{}\"><title>{} → {}: {}</title></rect>\n",
          x, y, l.cell, l.cell, detail::scale_colour(t), i, j, detail::exact(v),
          xml_text(e.tokens[static_cast<std::size_t>(i)]), xml_text(e.tokens[static_cast<std::size_t>(j)]),
          detail::fixed(v, precision));
      if (l.numbers)
        out += fmt::format(
            "<text class=\"num\" x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\" font-size=\"10\" "
            "fill=\"{}\">{}</text>\n",
            x + l.cell / 2, y + l.cell / 2 + 3.5, t > 0.55 ? "#ffffff" : "#000000", detail::fixed(v, 2));
    }
  }
  out += "</g>\n";
}

constexpr double kLegendWidth = 240, kLegendHeight = 56;

// The colour scale under the panels: a gradient with five ticks, and what the colours mean.
void draw_legend(std::string& out, double x, double y, ColorScale scale) {
  out += "<g class=\"legend\"><defs><linearGradient id=\"qkv-scale\">";
  for (int s = 0; s <= 10; ++s)
    out += fmt::format("<stop offset=\"{:.1f}\" stop-color=\"{}\"/>", s / 10.0, detail::scale_colour(s / 10.0));
  out += "</linearGradient></defs>\n";
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", x, y + 11,
                     scale == ColorScale::row ? "colour: each weight ÷ the largest weight of its row"
                                              : "colour: the attention weight (absolute, 0 to 1)");
  out += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"12\" fill=\"url(#qkv-scale)\" stroke=\"#888\"/>\n", x,
      y + 18, kLegendWidth);
  static constexpr const char* kAbsolute[] = {"0", "0.25", "0.5", "0.75", "1"};
  static constexpr const char* kRow[] = {"0", "25%", "50%", "75%", "row max"};
  for (int s = 0; s <= 4; ++s)
    out += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       x + kLegendWidth * s / 4.0, y + 44, scale == ColorScale::row ? kRow[s] : kAbsolute[s]);
  out += "</g>\n";
}

}  // namespace

std::string render_heatmap_svg(const Explanation& e, const SvgOptions& options) {
  const auto n = static_cast<int64_t>(e.tokens.size());
  const auto heads = static_cast<int64_t>(e.heads.size());
  if (n == 0 || heads == 0) throw Error("svg: nothing to draw: no tokens or no heads");
  detail::check_explanation(e, "svg");
  if (n > kMaxHeatmapTokens)
    throw Error(fmt::format("svg: {} tokens is more than the {} a heatmap shows", n, kMaxHeatmapTokens));
  if (options.head < -1 || options.head >= heads)
    throw Error(fmt::format("svg: head {} does not exist (the layer has {} head{})", options.head + 1, heads,
                            heads == 1 ? "" : "s"));
  const int64_t first = options.head < 0 ? 0 : options.head, last = options.head < 0 ? heads : options.head + 1;
  for (int64_t h = first; h < last; ++h) {
    const Matrix& w = e.heads[static_cast<std::size_t>(h)].weights;
    if (w.rows != n || w.cols != n)
      throw Error(fmt::format("svg: head {} has [{}, {}] weights for {} tokens", h + 1, w.rows, w.cols, n));
  }
  const Layout l = layout(e);
  const double legend_x = 30;  // room for the first tick's label, centred on the scale's start
  const double width = std::max(l.width * static_cast<double>(last - first), legend_x + kLegendWidth + 60);
  const double height = l.height + 12 + kLegendHeight;
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} "
      "{:.0f}\" font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height);
  out += fmt::format("<title>{}</title>\n", xml_text(e.title.empty() ? "Attention weights" : e.title));
  out += fmt::format("<rect width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#ffffff\"/>\n", width, height);
  for (int64_t h = first; h < last; ++h)
    draw_head(out, e, h, l, l.width * static_cast<double>(h - first), options.color_scale,
              std::clamp(options.precision, 1, 17));
  draw_legend(out, legend_x, l.height + 12, options.color_scale);
  return out + "</svg>\n";
}

}  // namespace qkv
