// Pictures of attention: a self-contained HTML page per explanation (every step as labelled
// matrices, a heatmap of the weights per head, a head/query selector that writes the query's
// context vector as a weighted sum of value vectors), a standalone SVG heatmap, a top-k page for
// inputs too long for an N×N heatmap, and a side-by-side page for one word in two sentences.
// Pages load nothing from the network: CSS, JS and data are inline. All user text is escaped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/explain.h"
#include "qkv/tensor.h"
#include "qkv/weights.h"

namespace qkv {

// The longest input shown as a dense N×N heatmap (a page of one head's weights is then about
// 20 MB); longer inputs get the top-k page.
inline constexpr int64_t kMaxHeatmapTokens = 1024;

// How weights become colours. absolute: the weight itself on a fixed 0-1 scale, so pages, heads and
// rows compare at a glance; row: each row (query) from 0 to its own largest weight, which shows
// the ranking inside a flat row (e.g. over 600 tokens, where every weight is small).
enum class ColorScale { absolute, row };

// "absolute" / "row", and back (nullopt for another name): the one spelling of both.
std::string_view color_scale_name(ColorScale scale);
std::optional<ColorScale> parse_color_scale(std::string_view name);

struct HtmlOptions {
  int precision = 4;           // decimals shown in tables and labels (exact values are in the data)
  bool context_first = false;  // `qkv context`: the contextual vectors lead the page
  ColorScale color_scale = ColorScale::absolute;
  // Words of the input left out (--oov skip), in order; the page names them in a visible note.
  std::vector<std::string> skipped_words;
  // What gives every value of a table the page shows only in part: the steps (scores, weights, ...)
  // and the contextual vectors, e.g. "qkv explain --json" and "--format json".
  std::string steps_hint = "--json", output_hint = "--json";
};

// The explanation as one HTML page. Requires e.tokens.size() <= kMaxHeatmapTokens (else
// qkv::Error: use the top-k page). Pure function of its arguments; thread-safe.
std::string render_explanation_html(const Explanation& e, const HtmlOptions& options = {});

struct SvgOptions {
  int64_t head = -1;  // the head to draw (0-based), or -1 for every head side by side
  int precision = 3;  // decimals printed in cells (when they are large enough to read) and titles
  ColorScale color_scale = ColorScale::absolute;
};

// The weights of the chosen head(s) as a standalone SVG document: tokens on both axes, a colour
// scale, one <rect> per cell with its exact weight in data-w and a <title> tooltip. Throws
// qkv::Error for a head out of range or more than kMaxHeatmapTokens tokens.
std::string render_heatmap_svg(const Explanation& e, const SvgOptions& options = {});

// What the top-k page shows: the tokens, the weights, and optionally the contextual vectors.
struct LongInputPage {
  std::string title;
  std::string source;
  std::vector<std::string> tokens;  // N (queries = keys: self-attention)
  TopKWeights top;
  Matrix output;  // [N, ·] contextual vectors, or empty
};

// A page listing each row's top-k weights with a head/query selector; scales to N in the
// thousands (the DOM holds one row's entries per head at a time). Throws qkv::Error if the sizes
// of `page` disagree.
std::string render_top_k_html(const LongInputPage& page, const HtmlOptions& options = {});

// One sentence of a comparison: where the word is, its weights against every token per head,
// and its static and contextual vectors.
struct WordInSentence {
  std::string sentence;
  std::vector<std::string> tokens;
  int64_t position = 0;                      // index of the word in tokens
  std::vector<std::vector<double>> weights;  // [H][tokens.size()]: the word's row of each head
  std::vector<double> static_vector;         // the word's embedding
  std::vector<double> contextual_vector;     // the layer's output row for the word
  std::vector<std::string> skipped_words;    // words of the sentence left out (--oov skip)
};

struct Comparison {
  std::string word;
  std::string layer;  // description of the layer
  double static_cosine = 0.0, contextual_cosine = 0.0;
  WordInSentence first, second;
};

// The word's weights in both sentences side by side, with both cosine similarities. Throws
// qkv::Error if the sizes disagree. Each sentence's skipped words come from its WordInSentence
// (options.skipped_words is not used).
std::string render_comparison_html(const Comparison& c, const HtmlOptions& options = {});

// Text as HTML character data or attribute value: & < > " ' escaped. Invalid UTF-8 is kept
// byte for byte (browsers show U+FFFD). Exposed for tests.
std::string html_escape(std::string_view text);

// JSON text made safe inside a <script> element: <, >, &, U+2028 and U+2029 become \u escapes,
// so "</script>" in a string cannot end the element. `json` must be valid JSON.
std::string json_for_script(std::string_view json);

}  // namespace qkv
