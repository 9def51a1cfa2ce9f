// Internal pieces shared by the page renderers: the page shell with its inline assets, number
// formatting, matrices as HTML tables, and colours of the weight scale.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "explain/matrix_json.h"

#include "qkv/explain.h"
#include "qkv/render.h"

namespace qkv::detail {

// The inline stylesheet and script (render_assets.cpp).
extern const char* const kPageCss;
extern const char* const kPageJs;

// A complete HTML document: `body` (already escaped HTML) followed by `data` as the JSON the
// script reads (<script type="application/json" id="qkv-data">) and the script itself. The data
// gains the colour stops and `scale`, the colour scale the script draws with.
std::string page_shell(std::string_view title, std::string_view body, nlohmann::json data, ColorScale scale);

// `text` cut to at most `max_chars` code points, with "…" when cut (long sentences as headings).
std::string shorten(std::string_view text, std::size_t max_chars = 120);

// `word` as HTML in its own bidi isolate (<bdi>), for a word shown beside other text: a
// right-to-left word, or one holding a direction override such as U+202E, cannot reorder the text
// and numbers around it. An isolate's end (U+2069) without its start is dropped and a start left
// open is closed, so the word can neither end the <bdi>'s isolate early nor hold it open. An ASCII
// word, which cannot reorder anything, is only escaped.
std::string bdi(std::string_view word);

// `x` with `precision` decimals ("-0" printed as "0").
std::string fixed(double x, int precision);

// The shortest text that reads back as exactly `x` (what JSON holds).
std::string exact(double x);

// A matrix as a labelled table: caption `name` and `note`, row labels (may be empty: indices),
// column indices or `col_labels` (tokens, for query × key matrices). Matrices larger than 48 × 24
// show their top-left corner and say that `all_hint` (an option, e.g. "--json") has every value.
std::string matrix_table(std::string_view name, std::string_view note, const Matrix& m,
                         const std::vector<std::string>& row_labels, int precision, std::string_view all_hint,
                         const std::vector<std::string>& col_labels = {});

// The visible note naming the words --oov skip left out of `which` ("the sentence"), or "" when
// none were.
std::string skipped_note(const std::vector<std::string>& words, std::string_view which = "the sentence");

// The colour of weight `t` in [0, 1] on the pages' scale (light yellow to dark blue), "#rrggbb".
std::string scale_colour(double t);

// JSON dumped with invalid UTF-8 replaced (tokens are raw user bytes).
std::string dump_json(const nlohmann::json& j);

}  // namespace qkv::detail
