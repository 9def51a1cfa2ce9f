// Escaping, number formatting, tables and the page shell shared by every page and the SVG.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "qkv/render.h"
#include "render/render_util.h"

namespace qkv {

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string json_for_script(std::string_view json) {
  std::string out;
  out.reserve(json.size() + 16);
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '<')
      out += "\\u003c";
    else if (c == '>')
      out += "\\u003e";
    else if (c == '&')
      out += "\\u0026";
    // U+2028 and U+2029 are E2 80 A8 / E2 80 A9 in UTF-8; they end lines in older JS parsers.
    else if (c == '\xE2' && i + 2 < json.size() && json[i + 1] == '\x80' &&
             (json[i + 2] == '\xA8' || json[i + 2] == '\xA9')) {
      out += json[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else
      out += c;
  }
  return out;
}

std::string_view color_scale_name(ColorScale scale) { return scale == ColorScale::row ? "row" : "absolute"; }

std::optional<ColorScale> parse_color_scale(std::string_view name) {
  for (ColorScale s : {ColorScale::absolute, ColorScale::row})
    if (name == color_scale_name(s)) return s;
  return std::nullopt;
}

namespace detail {
namespace {

// YlGnBu, light (weight 0) to dark (the largest weight).
constexpr std::array<std::array<int, 3>, 7> kStops = {
    {{255, 255, 217}, {199, 233, 180}, {127, 205, 187}, {65, 182, 196}, {29, 145, 192}, {34, 94, 168}, {12, 44, 132}}};

}  // namespace

std::string scale_colour(double t) {
  if (!(t > 0.0)) t = 0.0;
  if (t > 1.0) t = 1.0;
  const double pos = t * (kStops.size() - 1);
  const std::size_t a = std::min(static_cast<std::size_t>(pos), kStops.size() - 2);
  const double f = pos - static_cast<double>(a);
  int rgb[3];
  for (int c = 0; c < 3; ++c)
    rgb[c] = static_cast<int>(std::lround(kStops[a][c] + f * (kStops[a + 1][c] - kStops[a][c])));
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

std::string shorten(std::string_view text, std::size_t max_chars) {
  std::size_t chars = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    // Count lead bytes only, so a cut never splits a UTF-8 sequence.
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80 && chars++ == max_chars)
      return std::string(text.substr(0, i)) + "\xE2\x80\xA6";
  }
  return std::string(text);
}

std::string bdi(std::string_view word) {
  // ASCII holds no right-to-left letter nor direction control: such a word cannot reorder what
  // is around it, and goes without the markup.
  if (std::all_of(word.begin(), word.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return html_escape(word);
  // LRI, RLI and FSI (U+2066..U+2068) open an isolate, PDI (U+2069) closes one.
  constexpr std::string_view kPdi = "\xE2\x81\xA9";
  std::string kept;
  int open = 0;
  for (std::size_t i = 0; i < word.size(); ++i) {
    const std::string_view rest = word.substr(i);
    if (rest.starts_with(kPdi) && open == 0) {
      i += kPdi.size() - 1;
      continue;
    }
    if (rest.starts_with(kPdi))
      --open;
    else if (rest.starts_with("\xE2\x81\xA6") || rest.starts_with("\xE2\x81\xA7") || rest.starts_with("\xE2\x81\xA8"))
      ++open;
    kept += word[i];
  }
  for (; open > 0; --open) kept += kPdi;
  return fmt::format("<bdi>{}</bdi>", html_escape(kept));
}

std::string fixed(double x, int precision) {
  std::string s = fmt::format("{:.{}f}", x, std::clamp(precision, 0, 17));
  if (s.find_first_not_of("-0.") == std::string::npos && s[0] == '-') s.erase(0, 1);
  return s;
}

std::string exact(double x) { return fmt::format("{}", x); }

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string skipped_note(const std::vector<std::string>& words, std::string_view which) {
  if (words.empty()) return {};
  // Each distinct word once, in order of appearance, with how often it occurred.
  std::vector<std::pair<std::string, int>> counted;
  for (const std::string& w : words) {
    auto it = std::find_if(counted.begin(), counted.end(), [&](const auto& c) { return c.first == w; });
    if (it == counted.end())
      counted.emplace_back(w, 1);
    else
      ++it->second;
  }
  std::string list;
  for (const auto& [w, n] : counted)
    list += fmt::format("{}“{}”{}", list.empty() ? "" : ", ", bdi(w), n > 1 ? fmt::format(" ×{}", n) : "");
  return fmt::format(
      "<p class=\"note oov\" id=\"oov-note\">--oov skip left {} word{} out of {}, not being in the vocabulary: {}. "
      "The page shows the tokens that remain.</p>",
      words.size(), words.size() == 1 ? "" : "s", html_escape(which), list);
}

std::string matrix_table(std::string_view name, std::string_view note, const Matrix& m,
                         const std::vector<std::string>& row_labels, int precision, std::string_view all_hint,
                         const std::vector<std::string>& col_labels) {
  constexpr int64_t kMaxRows = 48, kMaxCols = 24;
  const int64_t rows = std::min(m.rows, kMaxRows), cols = std::min(m.cols, kMaxCols);
  std::string out = fmt::format("<figure class=\"matrix\" data-name=\"{}\"><figcaption><b>{}</b> [{} × {}]",
                                html_escape(name), html_escape(name), m.rows, m.cols);
  if (!note.empty()) out += fmt::format(" — {}", html_escape(note));
  if (rows < m.rows || cols < m.cols)
    out += fmt::format(" <span class=\"clip\">(showing the first {} rows × {} columns; {} has all)</span>", rows, cols,
                       html_escape(all_hint));
  // Token-by-token matrices name their corner and columns: row = query token, column = key token.
  out += fmt::format("</figcaption><div class=\"scroll\"><table><thead><tr><th>{}</th>",
                     col_labels.empty() ? "" : "query \\ key");
  for (int64_t j = 0; j < cols; ++j)
    out += static_cast<std::size_t>(j) < col_labels.size()
               ? fmt::format("<th>{}</th>", html_escape(col_labels[static_cast<std::size_t>(j)]))
               : fmt::format("<th>{}</th>", j);
  out += "</tr></thead><tbody>";
  for (int64_t i = 0; i < rows; ++i) {
    const bool named = static_cast<std::size_t>(i) < row_labels.size();
    out += fmt::format("<tr><th>{}</th>",
                       named ? html_escape(row_labels[static_cast<std::size_t>(i)]) : fmt::format("{}", i));
    for (int64_t j = 0; j < cols; ++j) out += fmt::format("<td>{}</td>", fixed(m(i, j), precision));
    out += "</tr>";
  }
  return out + "</tbody></table></div></figure>\n";
}

std::string page_shell(std::string_view title, std::string_view body, nlohmann::json d, ColorScale scale) {
  d["scale"] = std::string(color_scale_name(scale));
  nlohmann::json stops = nlohmann::json::array();
  for (const auto& s : kStops) stops.push_back({s[0], s[1], s[2]});
  d["colour_stops"] = std::move(stops);
  std::string out;
  out += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  // Nothing may come from the network; inline style and script are the whole page.
  out +=
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
      "script-src 'unsafe-inline'; img-src data:\">\n";
  out +=
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<link rel=\"icon\" href=\"data:,\">\n";
  out += fmt::format("<title>{}</title>\n<style>{}</style></head>\n<body>\n", html_escape(title), kPageCss);
  out += body;
  out += "\n<script type=\"application/json\" id=\"qkv-data\">";
  out += json_for_script(dump_json(d));
  out += "</script>\n<script>";
  out += kPageJs;
  out += "</script>\n</body></html>\n";
  return out;
}

}  // namespace detail
}  // namespace qkv
