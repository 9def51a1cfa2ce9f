// The heatmap as a standalone SVG document (for papers and slides): one <rect> per weight, the
// exact value in data-w and a <title> tooltip, tokens on both axes and a colour scale.
#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "qkv/error.h"
#include "qkv/render.h"
#include "render/render_util.h"

namespace qkv {
namespace {

constexpr std::size_t kLabelChars = 16;  // longer tokens are cut with an ellipsis on the axes

// Valid XML text: invalid UTF-8 and control characters (not allowed in XML 1.0) become U+FFFD,
// then markup characters are escaped. At most `max_chars` code points are kept.
std::string xml_text(std::string_view s, std::size_t max_chars = SIZE_MAX) {
  std::string clean;
  std::size_t chars = 0, i = 0;
  while (i < s.size() && chars < max_chars) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size() && c >= 0x20 && c != 0x7F && c != 0xC0 && c != 0xC1;
    for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok)
      clean.append(s.substr(i, len));
    else
      clean += "\xEF\xBF\xBD";
    i += ok ? len : 1;
    ++chars;
  }
  if (i < s.size()) clean += "\xE2\x80\xA6";
  return html_escape(clean);
}

struct Layout {
  int64_t n = 0;
  double cell = 0, left = 0, top = 0, grid = 0, width = 0;
  bool numbers = false;
};

Layout layout(const Explanation& e) {
  Layout l;
  l.n = static_cast<int64_t>(e.tokens.size());
  std::size_t longest = 1;
  for (const auto& t : e.tokens) longest = std::max(longest, std::min(t.size(), kLabelChars + 1));
  l.cell = l.n <= 12 ? 44.0 : std::clamp(640.0 / static_cast<double>(l.n), 3.0, 30.0);
  l.numbers = l.cell >= 30.0;
  const bool labels = l.cell >= 8.0;
  l.left = labels ? 30.0 + 6.5 * static_cast<double>(longest) : 30.0;  // room for the query-axis title
  l.top = labels ? 46.0 + 5.0 * static_cast<double>(longest) : 46.0;   // key labels are turned 60°
  l.grid = l.cell * static_cast<double>(l.n);
  l.width = l.left + l.grid + 24.0;
  return l;
}

void draw_head(std::string& out, const Explanation& e, int64_t h, const Layout& l, double x0, double vmax,
               int precision) {
  const Matrix& w = e.heads[static_cast<std::size_t>(h)].weights;
  out += fmt::format("<g class=\"head\" data-head=\"{}\" transform=\"translate({:.1f},0)\">\n", h, x0);
  out += fmt::format("<text class=\"head-title\" x=\"{:.1f}\" y=\"16\" font-weight=\"bold\">Head {}</text>\n", l.left,
                     h + 1);
  out += fmt::format(
      "<text class=\"axis-title\" x=\"{:.1f}\" y=\"32\" text-anchor=\"middle\">keys (columns): the tokens "
      "attended to</text>\n<text class=\"axis-title\" transform=\"translate(14,{:.1f}) rotate(-90)\" "
      "text-anchor=\"middle\">queries (rows): the tokens attending</text>\n",
      l.left + l.grid / 2.0, l.top + l.grid / 2.0);
  if (l.cell >= 8.0) {
    for (int64_t j = 0; j < l.n; ++j)
      out += fmt::format("<text class=\"key\" transform=\"translate({:.1f},{:.1f}) rotate(-60)\">{}</text>\n",
                         l.left + (static_cast<double>(j) + 0.6) * l.cell, l.top - 4.0,
                         xml_text(e.tokens[static_cast<std::size_t>(j)], kLabelChars));
    for (int64_t i = 0; i < l.n; ++i)
      out += fmt::format("<text class=\"query\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
                         l.left - 4.0, l.top + (static_cast<double>(i) + 0.5) * l.cell + 4.0,
                         xml_text(e.tokens[static_cast<std::size_t>(i)], kLabelChars));
  }
  for (int64_t i = 0; i < l.n; ++i) {
    for (int64_t j = 0; j < l.n; ++j) {
      const double v = w(i, j), x = l.left + static_cast<double>(j) * l.cell,
                   y = l.top + static_cast<double>(i) * l.cell;
      out += fmt::format(
          "<rect class=\"cell\" x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\" data-i=\"{}\" "
          "data-j=\"{}\" data-w=\"{}\"><title>{} → {}: {}</title></rect>\n",
          x, y, l.cell, l.cell, detail::scale_colour(vmax > 0 ? v / vmax : 0.0), i, j, detail::exact(v),
          xml_text(e.tokens[static_cast<std::size_t>(i)]), xml_text(e.tokens[static_cast<std::size_t>(j)]),
          detail::fixed(v, precision));
      if (l.numbers)
        out += fmt::format(
            "<text class=\"num\" x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\" font-size=\"10\" "
            "fill=\"{}\">{}</text>\n",
            x + l.cell / 2, y + l.cell / 2 + 3.5, v / vmax > 0.55 ? "#ffffff" : "#000000", detail::fixed(v, 2));
    }
  }
  out += "</g>\n";
}

void draw_legend(std::string& out, double x, double y, double width, double vmax) {
  out += "<g class=\"legend\"><defs><linearGradient id=\"qkv-scale\">";
  for (int s = 0; s <= 10; ++s)
    out += fmt::format("<stop offset=\"{:.1f}\" stop-color=\"{}\"/>", s / 10.0, detail::scale_colour(s / 10.0));
  out += "</linearGradient></defs>\n";
  out += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"12\" fill=\"url(#qkv-scale)\" "
      "stroke=\"#888\"/>\n",
      x, y, width);
  for (int s = 0; s <= 4; ++s)
    out += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       x + width * s / 4.0, y + 26.0, detail::fixed(vmax * s / 4.0, 3));
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">attention weight</text>\n</g>\n", x, y - 4.0);
}

}  // namespace

std::string render_heatmap_svg(const Explanation& e, const SvgOptions& options) {
  const auto n = static_cast<int64_t>(e.tokens.size());
  const auto heads = static_cast<int64_t>(e.heads.size());
  if (n == 0 || heads == 0) throw Error("svg: nothing to draw: no tokens or no heads");
  if (n > kMaxHeatmapTokens)
    throw Error(fmt::format("svg: {} tokens is more than the {} a heatmap shows", n, kMaxHeatmapTokens));
  if (options.head < -1 || options.head >= heads)
    throw Error(fmt::format("svg: head {} does not exist (the layer has {} head{})", options.head + 1, heads,
                            heads == 1 ? "" : "s"));
  const int64_t first = options.head < 0 ? 0 : options.head, last = options.head < 0 ? heads : options.head + 1;
  double vmax = 0.0;
  for (int64_t h = first; h < last; ++h) {
    const Matrix& w = e.heads[static_cast<std::size_t>(h)].weights;
    if (w.rows != n || w.cols != n)
      throw Error(fmt::format("svg: head {} has [{}, {}] weights for {} tokens", h + 1, w.rows, w.cols, n));
    for (double v : w.data) vmax = std::max(vmax, v);
  }
  const Layout l = layout(e);
  const double width = std::max(l.width * static_cast<double>(last - first), l.left + 280.0);
  const double height = l.top + l.grid + 64.0;
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} "
      "{:.0f}\" font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height);
  out += fmt::format("<title>{}</title>\n", xml_text(e.title.empty() ? "Attention weights" : e.title));
  out += fmt::format("<rect width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#ffffff\"/>\n", width, height);
  for (int64_t h = first; h < last; ++h)
    draw_head(out, e, h, l, l.width * static_cast<double>(h - first), vmax, std::clamp(options.precision, 1, 17));
  draw_legend(out, l.left, l.top + l.grid + 22.0, std::clamp(l.grid, 160.0, 240.0), vmax);
  return out + "</svg>\n";
}

}  // namespace qkv
