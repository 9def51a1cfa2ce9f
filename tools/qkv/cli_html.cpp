// Pages of the sentence commands, from the layer's own projections (LayerCache) so that long
// sentences never need the float64 explanation and its N×N matrices.
#include "cli_html.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <utility>

#include "qkv/explain.h"
#include "qkv/interrupt.h"

namespace qkv::cli {
namespace {

struct Projections {
  LayerCache cache;
  Tensor<float> y;
  TensorView<const float> q, k;  // [H, N, D], [Hkv, N, D] views into `cache`
};

// Runs the layer once and returns q and k per head as strided views of its projected rows.
Projections project(const EmbeddedSentence& s, const MultiHeadAttention& layer) {
  Projections p;
  p.y = layer.forward(s.x.cview(), {}, {}, &p.cache);
  const LayerConfig& c = layer.config();
  const int64_t N = s.x.dim(0);
  // A parameter-free layer keeps no projections: Q = K = X.
  const float* q = c.parameter_free ? p.cache.x.data() : p.cache.q.data();
  const float* k = c.parameter_free ? p.cache.x.data() : p.cache.k.data();
  const int64_t H = c.num_heads, Hkv = c.num_kv_heads, D = c.parameter_free ? c.embed_dim : c.head_dim;
  const std::array<int64_t, 3> qs{H, N, D}, qst{D, H * D, 1}, ks{Hkv, N, D}, kst{D, Hkv * D, 1};
  p.q = TensorView<const float>(q, qs, qst);
  p.k = TensorView<const float>(k, ks, kst);
  return p;
}

// A long page's top-k pass takes seconds to minutes (a row is a pass over every key): a note on
// stderr shows the rows done, redrawn each second on a terminal, else a line every 10 seconds.
class ProgressNote {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ProgressNote(const char* what) : what_(what), tty_(::isatty(2) != 0), start_(Clock::now()), last_(start_) {}
  ~ProgressNote() {
    if (drawn_ && tty_) std::fputc('\n', stderr);
  }
  static bool poll(void* self) {
    static_cast<ProgressNote*>(self)->draw();
    return false;  // never stops the call (Ctrl-C ends the process)
  }
  InterruptScope* scope = nullptr;

 private:
  void draw() {
    const Clock::time_point now = Clock::now();
    if (now - last_ < (tty_ ? std::chrono::seconds(1) : std::chrono::seconds(10)) || scope == nullptr) return;
    last_ = now;
    const int64_t done = scope->done(), total = std::max<int64_t>(scope->total(), 1);
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double eta = done > 0 ? seconds * static_cast<double>(total - done) / static_cast<double>(done) : 0.0;
    const double percent = 100.0 * static_cast<double>(done) / static_cast<double>(total);
    std::fprintf(stderr, "%sqkv: %s: %lld of %lld rows (%.0f%%), %.0f s, about %.0f s left%s", tty_ ? "\r" : "", what_,
                 static_cast<long long>(done), static_cast<long long>(total), percent, seconds, eta,
                 tty_ ? "   " : "\n");
    std::fflush(stderr);
    drawn_ = true;
  }
  const char* what_;
  bool tty_;
  Clock::time_point start_, last_;
  bool drawn_ = false;
};

std::vector<std::string> skipped_words(const SentenceArgs& args, const EmbeddedSentence& s) {
  return oov_policy(args) == OovPolicy::skip ? s.missing : std::vector<std::string>{};
}

}  // namespace

void finish(const std::function<std::string()>& text, OutputFiles pictures, const OutputFiles& outputs) {
  if (!pictures.empty()) {
    pictures.insert(pictures.end(), outputs.begin(), outputs.end());
    write_outputs(pictures);
  } else if (!outputs.empty()) {
    write_outputs(outputs);
  } else {
    write_stdout(text());
  }
}

void add_color_scale_option(CLI::App* app, ColorScale& scale) {
  std::vector<std::string> names;
  for (ColorScale s : {ColorScale::absolute, ColorScale::row}) names.emplace_back(color_scale_name(s));
  app->add_option_function<std::string>(
         "--color-scale", [&scale](const std::string& name) { scale = *parse_color_scale(name); },
         "Colours of --html/--svg: absolute (default: the weight itself, 0 to 1, comparable across rows and "
         "heads) or row (each row from 0 to its largest weight)")
      ->check(CLI::IsMember(names));
}

HtmlOptions page_options(const SentenceArgs& args, const EmbeddedSentence& s, ColorScale scale) {
  HtmlOptions options;
  options.color_scale = scale;
  options.skipped_words = skipped_words(args, s);
  return options;
}

std::string top_k_page(const EmbeddedSentence& s, const MultiHeadAttention& layer, const std::string& title,
                       const std::string& source, bool with_output, const HtmlOptions& options) {
  const Projections p = project(s, layer);
  LongInputPage page;
  page.title = title;
  page.source = source;
  page.tokens = s.tokens;
  // Normalized by the fused kernel's own log-sum-exp: the page shows what the fused path computed.
  const std::array<int64_t, 2> lse_shape{p.cache.lse.dim(1), p.cache.lse.dim(2)};
  const Tensor<float> lse = to_contiguous<float>(TensorView<const double>(p.cache.lse.data(), lse_shape));
  {
    ProgressNote note("top weights per row");
    InterruptScope scope(&ProgressNote::poll, &note);
    note.scope = &scope;
    page.top = attention_top_k(p.q, p.k, kPageTopK, {}, lse.cview());
  }
  if (with_output) page.output = Matrix::from_view(p.y.cview(), "contextual vectors");
  return render_top_k_html(page, options);
}

std::string context_page(const EmbeddedSentence& s, const MultiHeadAttention& layer, const std::string& title,
                         const std::string& source, HtmlOptions options) {
  // The contextual vectors are what `qkv context --format json` prints; the other steps are
  // `qkv explain --json`'s.
  options.output_hint = "qkv context --format json";
  options.steps_hint = "qkv explain --json";
  options.context_first = true;
  if (static_cast<int64_t>(s.tokens.size()) > kMaxHeatmapTokens)
    return top_k_page(s, layer, title, source, true, options);
  Explanation e = explain_layer(s.tokens, s.x.cview(), layer);
  e.title = title;
  e.source = source;
  return render_explanation_html(e, options);
}

WordInSentence word_in_sentence(const std::string& sentence, const EmbeddedSentence& s, int64_t position,
                                const MultiHeadAttention& layer, TensorView<const float> contextual,
                                const SentenceArgs& args) {
  const Projections p = project(s, layer);
  WordInSentence w;
  w.sentence = sentence;
  w.tokens = s.tokens;
  w.position = position;
  for (int64_t h = 0; h < p.q.dim(0); ++h) w.weights.push_back(attention_row(p.q, p.k, h, position));
  for (int64_t j = 0; j < s.x.dim(1); ++j) w.static_vector.push_back(s.x.cview()(position, j));
  for (int64_t j = 0; j < contextual.dim(1); ++j) w.contextual_vector.push_back(contextual(position, j));
  w.skipped_words = skipped_words(args, s);
  return w;
}

}  // namespace qkv::cli
