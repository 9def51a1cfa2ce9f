// The explanation steps, computed directly in float64 from their textbook definitions (no kernel
// is involved, so an explanation is also an independent check of the kernels).
#include "qkv/explain.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "attention/output_checks.h"
#include "attention/overflow.h"
#include "qkv/attention_options.h"
#include "qkv/error.h"
#include "qkv/layer.h"

namespace qkv {

Matrix Matrix::from_rows(const std::vector<std::vector<double>>& rows) {
  Matrix m(static_cast<int64_t>(rows.size()), rows.empty() ? 0 : static_cast<int64_t>(rows[0].size()));
  for (int64_t i = 0; i < m.rows; ++i) {
    if (static_cast<int64_t>(rows[i].size()) != m.cols)
      throw Error(fmt::format("matrix row {} has {} values, row 0 has {}", i, rows[i].size(), m.cols));
    for (int64_t j = 0; j < m.cols; ++j) m(i, j) = rows[i][j];
  }
  return m;
}

Matrix Matrix::from_view(TensorView<const float> view, const std::string& what) {
  detail::require_data(view, what);  // a shape without data read as no tokens ("nothing to explain")
  if (view.empty() || view.numel() == 0) return {};
  if (view.rank() == 1) {
    Matrix m(1, view.dim(0));
    for (int64_t j = 0; j < m.cols; ++j) m(0, j) = view(j);
    return m;
  }
  if (view.rank() != 2)
    throw Error(fmt::format("{}: expected a matrix, got shape {}", what, shape_string(view.shape())));
  Matrix m(view.dim(0), view.dim(1));
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) m(i, j) = view(i, j);
  return m;
}

namespace {

// a [n, k] · b [k, m], or a · bᵀ for b [m, k] when transpose_b.
Matrix matmul(const Matrix& a, const Matrix& b, bool transpose_b = false) {
  Matrix c(a.rows, transpose_b ? b.rows : b.cols);
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.cols; ++j) {
      double acc = 0.0;
      for (int64_t t = 0; t < a.cols; ++t) acc += a(i, t) * (transpose_b ? b(j, t) : b(t, j));
      c(i, j) = acc;
    }
  return c;
}

Matrix columns(const Matrix& m, int64_t start, int64_t count) {
  Matrix c(m.rows, count);
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < count; ++j) c(i, j) = m(i, start + j);
  return c;
}

void add_bias(Matrix& m, const Matrix& bias) {
  if (bias.empty()) return;
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) m(i, j) += bias(0, j);
}

void check_bias(const Matrix& bias, int64_t cols, const char* name) {
  if (!bias.empty() && (bias.rows != 1 || bias.cols != cols))
    throw Error(fmt::format("{}: expected {} values, got [{}, {}]", name, cols, bias.rows, bias.cols));
}

TensorView<const double> view(const Matrix& m) { return {m.data.data(), {m.rows, m.cols}}; }

bool finite(const Matrix& m) { return detail::all_finite(view(m)); }

// The first step of `e` with a value past float64's range, in the order they are computed ("" if
// none).
std::string overflowed_step(const Explanation& e) {
  for (std::size_t h = 0; h < e.heads.size(); ++h) {
    const HeadSteps& s = e.heads[h];
    for (const auto& [m, name] : {std::pair{&s.q, "Q"},
                                  {&s.k, "K"},
                                  {&s.v, "V"},
                                  {&s.scores, "the scores Q·Kᵀ"},
                                  {&s.scaled_scores, "the scaled scores"},
                                  {&s.weights, "the weights"},
                                  {&s.context, "the context vectors"}})
      if (!finite(*m)) return fmt::format("{} of head {}", name, h);
  }
  return finite(e.output) ? "" : "the output";
}

// By the attention kernels' rule (refuse_overflow), a step past float64's range from finite inputs
// is refused, never shown as inf or NaN weights; non-finite inputs are the caller's own.
void refuse_overflowed_step(const Explanation& e) {
  const std::string step = overflowed_step(e);
  if (step.empty()) return;
  const bool from_qkv = e.w_q.empty();  // Q = K = V = X, or q, k, v given
  const char* inputs = from_qkv ? (e.parameter_free ? "X" : "q, k and v") : "X, the weights and the biases";
  const detail::Overflow o{"explain", "float64", "1.8e308", "scale the inputs down", inputs, step.c_str()};
  if (from_qkv) {
    const HeadSteps& h = e.heads.at(0);
    detail::refuse_overflow<double>(o, view(h.q), view(h.k), view(h.v), Mask{});
    return;
  }
  bool others_finite = true;
  for (const Matrix* m : {&e.w_v, &e.b_q, &e.b_k, &e.b_v, &e.w_o, &e.b_o}) others_finite = others_finite && finite(*m);
  detail::refuse_overflow<double>(o, view(e.x), view(e.w_q), view(e.w_k), Mask{}, nullptr, !others_finite);
}

HeadSteps attend(Matrix q, Matrix k, Matrix v, const StepOptions& options) {
  HeadSteps h;
  h.scores = matmul(q, k, true);
  h.scale = options.scaled ? attention_scale(std::nullopt, q.cols) : 1.0;
  h.scaled_scores = h.scores;
  for (double& s : h.scaled_scores.data) s *= h.scale;
  h.weights = h.scaled_scores;
  for (int64_t i = 0; i < h.weights.rows; ++i) {
    // Causal: keys after the query take no part (key 0 always does, so no row is empty).
    const int64_t seen = options.causal ? std::min(i + 1, h.weights.cols) : h.weights.cols;
    double row_max = -INFINITY;
    for (int64_t j = 0; j < seen; ++j) row_max = std::max(row_max, h.weights(i, j));
    double sum = 0.0;
    for (int64_t j = 0; j < seen; ++j) sum += h.weights(i, j) = std::exp(h.weights(i, j) - row_max);
    for (int64_t j = 0; j < seen; ++j) h.weights(i, j) /= sum;
    for (int64_t j = seen; j < h.weights.cols; ++j) h.weights(i, j) = 0.0;
  }
  h.context = matmul(h.weights, v);
  h.q = std::move(q);
  h.k = std::move(k);
  h.v = std::move(v);
  return h;
}

void check_tokens(const std::vector<std::string>& tokens, int64_t rows, const char* what) {
  if (rows == 0) throw Error("nothing to explain: no tokens");
  if (static_cast<int64_t>(tokens.size()) != rows)
    throw Error(fmt::format("{}: {} rows but {} tokens", what, rows, tokens.size()));
}

Explanation projections(std::vector<std::string> tokens, Matrix x, Matrix w_q, Matrix w_k, Matrix w_v,
                        int64_t num_heads, int64_t num_kv_heads, Matrix b_q, Matrix b_k, Matrix b_v, Matrix w_o,
                        Matrix b_o, const StepOptions& options) {
  check_tokens(tokens, x.rows, "X");
  const int64_t E = x.cols;
  require_head_groups(num_heads, num_kv_heads, "heads");
  if (w_q.rows != E || w_k.rows != E || w_v.rows != E)
    throw Error(fmt::format("W_q, W_k, W_v must have E = {} rows (the width of X), got {}, {}, {}", E, w_q.rows,
                            w_k.rows, w_v.rows));
  if (w_q.cols == 0 || w_q.cols % num_heads != 0)
    throw Error(fmt::format("W_q has {} columns, not a positive multiple of H = {}", w_q.cols, num_heads));
  const int64_t D = w_q.cols / num_heads;
  if (w_k.cols != num_kv_heads * D)
    throw Error(fmt::format("W_k has {} columns, expected Hkv·D = {}", w_k.cols, num_kv_heads * D));
  if (w_v.cols == 0 || w_v.cols % num_kv_heads != 0)
    throw Error(fmt::format("W_v has {} columns, not a positive multiple of Hkv = {}", w_v.cols, num_kv_heads));
  const int64_t Dv = w_v.cols / num_kv_heads;
  check_bias(b_q, w_q.cols, "b_q");
  check_bias(b_k, w_k.cols, "b_k");
  check_bias(b_v, w_v.cols, "b_v");
  if (!w_o.empty() && w_o.rows != num_heads * Dv)
    throw Error(fmt::format("W_o has {} rows, expected H·Dv = {}", w_o.rows, num_heads * Dv));
  if (!w_o.empty()) check_bias(b_o, w_o.cols, "b_o");

  Matrix q = matmul(x, w_q), k = matmul(x, w_k), v = matmul(x, w_v);
  add_bias(q, b_q);
  add_bias(k, b_k);
  add_bias(v, b_v);

  Explanation e;
  e.style = "sentence";
  e.num_heads = num_heads;
  e.num_kv_heads = num_kv_heads;
  e.d_k = D;
  e.concat = Matrix(x.rows, num_heads * Dv);
  const int64_t group = num_heads / num_kv_heads;
  for (int64_t h = 0; h < num_heads; ++h) {
    const int64_t hk = h / group;
    e.heads.push_back(attend(columns(q, h * D, D), columns(k, hk * D, D), columns(v, hk * Dv, Dv), options));
    for (int64_t i = 0; i < x.rows; ++i)
      for (int64_t j = 0; j < Dv; ++j) e.concat(i, h * Dv + j) = e.heads.back().context(i, j);
  }
  if (w_o.empty()) {
    e.output = e.concat;
  } else {
    e.output = matmul(e.concat, w_o);
    add_bias(e.output, b_o);
  }
  e.tokens = std::move(tokens);
  e.x = std::move(x);
  e.w_q = std::move(w_q);
  e.w_k = std::move(w_k);
  e.w_v = std::move(w_v);
  e.b_q = std::move(b_q);
  e.b_k = std::move(b_k);
  e.b_v = std::move(b_v);
  if (!w_o.empty()) e.b_o = std::move(b_o);
  e.w_o = std::move(w_o);
  refuse_overflowed_step(e);
  return e;
}

Explanation from_qkv(std::vector<std::string> tokens, Matrix q, Matrix k, Matrix v, const StepOptions& options) {
  check_tokens(tokens, q.rows, "q");
  if (k.rows != q.rows || v.rows != q.rows || k.cols != q.cols || q.cols == 0 || v.cols == 0)
    throw Error(fmt::format("q [{}, {}], k [{}, {}] and v [{}, {}] must have the same rows, and q and k the same width",
                            q.rows, q.cols, k.rows, k.cols, v.rows, v.cols));
  Explanation e;
  e.style = "sentence";
  e.d_k = q.cols;
  e.tokens = std::move(tokens);
  e.heads.push_back(attend(std::move(q), std::move(k), std::move(v), options));
  e.concat = e.heads[0].context;
  e.output = e.concat;
  return e;
}

Explanation parameter_free(std::vector<std::string> tokens, Matrix x, const StepOptions& options) {
  check_tokens(tokens, x.rows, "X");
  Explanation e = from_qkv(std::move(tokens), x, x, x, options);
  e.x = std::move(x);
  e.parameter_free = true;
  refuse_overflowed_step(e);
  return e;
}

}  // namespace

Explanation explain_projections(std::vector<std::string> tokens, Matrix x, Matrix w_q, Matrix w_k, Matrix w_v,
                                int64_t num_heads, int64_t num_kv_heads, Matrix b_q, Matrix b_k, Matrix b_v, Matrix w_o,
                                Matrix b_o) {
  return projections(std::move(tokens), std::move(x), std::move(w_q), std::move(w_k), std::move(w_v), num_heads,
                     num_kv_heads, std::move(b_q), std::move(b_k), std::move(b_v), std::move(w_o), std::move(b_o), {});
}

Explanation explain_qkv(std::vector<std::string> tokens, Matrix q, Matrix k, Matrix v) {
  Explanation e = from_qkv(std::move(tokens), std::move(q), std::move(k), std::move(v), {});
  refuse_overflowed_step(e);
  return e;
}

Explanation explain_parameter_free(std::vector<std::string> tokens, Matrix x) {
  return parameter_free(std::move(tokens), std::move(x), {});
}

Explanation explain_layer(std::vector<std::string> tokens, TensorView<const float> x, const MultiHeadAttention& layer,
                          const StepOptions& options) {
  const LayerConfig& c = layer.config();
  Matrix xm = Matrix::from_view(x, "X");
  if (c.parameter_free) return parameter_free(std::move(tokens), std::move(xm), options);
  const int64_t kv_heads = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
  Explanation e =
      projections(std::move(tokens), std::move(xm), Matrix::from_view(layer.w_q.cview(), "w_q"),
                  Matrix::from_view(layer.w_k.cview(), "w_k"), Matrix::from_view(layer.w_v.cview(), "w_v"), c.num_heads,
                  kv_heads, Matrix::from_view(layer.b_q.cview(), "b_q"), Matrix::from_view(layer.b_k.cview(), "b_k"),
                  Matrix::from_view(layer.b_v.cview(), "b_v"), Matrix::from_view(layer.w_o.cview(), "w_o"),
                  Matrix::from_view(layer.b_o.cview(), "b_o"), options);
  if (c.residual) {
    for (int64_t i = 0; i < e.output.rows; ++i)
      for (int64_t j = 0; j < e.output.cols; ++j) e.output(i, j) += e.x(i, j);
    e.residual = true;
    refuse_overflowed_step(e);
  }
  return e;
}

std::vector<std::string> example_names() { return {"seed-003", "playing-outside"}; }

Explanation explain_example(std::string_view name) {
  if (name == "seed-003") {
    // Seed 003, "How Self-Attention Is Calculated": 3 words, embedding size 4, W's 4 -> 4.
    Matrix x = Matrix::from_rows({{1.0, 0.0, 1.0, 0.0}, {0.0, 2.0, 0.0, 2.0}, {1.0, 1.0, 1.0, 1.0}});
    Matrix w_q =
        Matrix::from_rows({{0.1, 0.2, 0.0, 0.0}, {0.0, 0.1, 0.3, 0.0}, {0.1, 0.0, 0.0, 0.2}, {0.0, 0.0, 0.2, 0.3}});
    Matrix w_k =
        Matrix::from_rows({{0.2, 0.0, 0.1, 0.0}, {0.0, 0.1, 0.0, 0.3}, {0.1, 0.0, 0.2, 0.0}, {0.0, 0.2, 0.0, 0.1}});
    Matrix w_v =
        Matrix::from_rows({{0.0, 0.1, 0.0, 0.2}, {0.2, 0.0, 0.2, 0.0}, {0.0, 0.3, 0.1, 0.0}, {0.1, 0.0, 0.0, 0.3}});
    Explanation e = explain_projections({"word 1", "word 2", "word 3"}, std::move(x), std::move(w_q), std::move(w_k),
                                        std::move(w_v), 1, 1);
    e.title = "How Self-Attention Is Calculated: 3 words, embedding size 4";
    e.source = "seed 003's worked example (X, W_q, W_k, W_v from the seed)";
    e.style = "seed003";
    e.weights = "given by seed 003";
    return e;
  }
  if (name == "playing-outside") {
    // Seed 000, "Playing Outside": the sample q, k, v vectors assumed for both words.
    Matrix q = Matrix::from_rows({{0.212, 0.04, 0.63, 0.36}, {0.1, 0.14, 0.86, 0.77}});
    Matrix k = Matrix::from_rows({{0.31, 0.84, 0.963, 0.57}, {0.45, 0.94, 0.73, 0.58}});
    Matrix v = Matrix::from_rows({{0.36, 0.83, 0.1, 0.38}, {0.31, 0.36, 0.19, 0.72}});
    Explanation e = explain_qkv({"Playing", "Outside"}, std::move(q), std::move(k), std::move(v));
    e.title = "Self-attention for the sequence \"Playing Outside\"";
    e.source = "seed 000's sample vectors q1, k1, v1 (Playing) and q2, k2, v2 (Outside)";
    e.style = "seed000";
    return e;
  }
  std::string names;
  for (const std::string& n : example_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error(fmt::format("unknown example '{}' (known: {})", name, names));
}

}  // namespace qkv
