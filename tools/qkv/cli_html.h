// The pictures of the sentence commands (--html, --svg): pages built from a sentence and a layer,
// switching to the top-k page when the sentence is longer than a heatmap shows. Owned by the
// renderer (include/qkv/render.h); the cmd_*.cpp files only call these.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_util.h"

#include "qkv/embeddings.h"
#include "qkv/layer.h"
#include "qkv/render.h"

namespace qkv::cli {

// The number of weights per row the long-input page lists.
inline constexpr int64_t kPageTopK = 10;

using OutputFiles = std::vector<std::pair<std::string, std::string>>;  // (path, bytes)

// How the sentence commands (explain, context, compare) end, the one rule for their pictures:
// when `pictures` (--html, --svg) are requested they are written with `outputs` (--out), all or
// none, and nothing is printed: the page replaces the text. Otherwise `outputs` are written, or,
// with none, text() goes to standard output.
void finish(const std::function<std::string()>& text, OutputFiles pictures, const OutputFiles& outputs = {});

// --color-scale absolute|row, for the commands that write pages.
void add_color_scale_option(CLI::App* app, ColorScale& scale);

// The page options of a sentence: the colour scale, and the words --oov skip left out of it.
HtmlOptions page_options(const SentenceArgs& args, const EmbeddedSentence& s, ColorScale scale);

// The top-k page for `s` through `layer` (one forward pass on the fused path; the weights are
// recomputed row by row, so no N×N matrix exists). With `with_output` the page also shows the
// contextual vectors.
std::string top_k_page(const EmbeddedSentence& s, const MultiHeadAttention& layer, const std::string& title,
                       const std::string& source, bool with_output, const HtmlOptions& options);

// `qkv context --html`: the explanation page with the contextual vectors first, or the top-k
// page (with the contextual vectors) for more than kMaxHeatmapTokens tokens.
std::string context_page(const EmbeddedSentence& s, const MultiHeadAttention& layer, const std::string& title,
                         const std::string& source, HtmlOptions options);

// One side of `qkv compare --html`: the word at `position` of `s`, its weights per head (row by
// row, any length), its static vector and its contextual vector (row `position` of `contextual`),
// and the words --oov skip left out of the sentence.
WordInSentence word_in_sentence(const std::string& sentence, const EmbeddedSentence& s, int64_t position,
                                const MultiHeadAttention& layer, TensorView<const float> contextual,
                                const SentenceArgs& args);

}  // namespace qkv::cli
