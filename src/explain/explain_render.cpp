// Text and JSON renderings of an Explanation. The text follows the seeds' own step names: seed
// 003's five steps (project, scores, scale, softmax, weighted sum) and seed 000's q/k/v vectors
// per word with the context vector written as a weighted sum of value vectors.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "explain/explanation_checks.h"
#include "explain/matrix_json.h"
#include "qkv/explain.h"

namespace qkv {
namespace {

// Matrices wider or taller than this are shown in part in text (the JSON has everything).
constexpr int64_t kMaxCols = 10;
constexpr int64_t kMaxRows = 12;

std::string number(double v, int precision) { return fmt::format("{:.{}f}", v + 0.0, precision); }

// A row as "[ 0.10000000  0.20000000]", eliding the middle of long rows.
std::string row_text(const Matrix& m, int64_t i, int precision, std::size_t width) {
  std::string s = "[";
  for (int64_t j = 0; j < m.cols; ++j) {
    if (m.cols > kMaxCols && j == kMaxCols - 2) {
      s += fmt::format("  … ({} columns)", m.cols);
      j = m.cols - 2;
      continue;
    }
    s += fmt::format(" {:>{}}", number(m(i, j), precision), width);
  }
  return s + "]";
}

std::size_t number_width(const Matrix& m, int precision) {
  std::size_t w = 1;
  for (double v : m.data) w = std::max(w, number(v, precision).size());
  return w;
}

std::size_t label_width(const std::vector<std::string>& labels) {
  std::size_t w = 0;
  for (const auto& l : labels) w = std::max(w, l.size());
  return w;
}

// "name [r x c]:" then one line per row, labelled by token when `labels` has one per row.
// `columns`: names for the columns of a query × key matrix (a header line), when all fit.
void matrix_block(std::string& out, const std::string& name, const Matrix& m, const std::vector<std::string>& labels,
                  int precision, const std::vector<std::string>& columns = {}) {
  out += fmt::format("  {} [{} x {}]:\n", name, m.rows, m.cols);
  const bool labelled = static_cast<int64_t>(labels.size()) == m.rows;
  const std::size_t lw = labelled ? label_width(labels) : 0;
  const bool headed =
      static_cast<int64_t>(columns.size()) == m.cols && m.cols <= kMaxCols && label_width(columns) <= 16;
  const std::size_t nw = std::max(number_width(m, precision), headed ? label_width(columns) : 0);
  if (headed) {
    out += fmt::format("    {:<{}}{} ", "", lw, labelled ? "  " : "");
    for (const std::string& c : columns) out += fmt::format(" {:>{}}", c, nw);
    out += "\n";
  }
  for (int64_t i = 0; i < m.rows; ++i) {
    if (m.rows > kMaxRows && i == kMaxRows - 2) {
      out += fmt::format("    … ({} rows)\n", m.rows);
      i = m.rows - 2;
      continue;
    }
    const std::string label = labelled ? labels[static_cast<std::size_t>(i)] : "";
    out += fmt::format("    {:<{}}{}{}\n", label, lw, labelled ? "  " : "", row_text(m, i, precision, nw));
  }
}

// "0.31359894·"word 1" + 0.35006362·"word 2" + …": row i of the weights applied to the values.
// Long sentences show only the largest terms, in sentence order.
std::string weighted_sum(const HeadSteps& h, int64_t i, const std::vector<std::string>& names, int precision,
                         const char* times) {
  std::vector<int64_t> shown(static_cast<std::size_t>(h.weights.cols));
  for (int64_t j = 0; j < h.weights.cols; ++j) shown[static_cast<std::size_t>(j)] = j;
  if (h.weights.cols > kMaxCols) {
    std::partial_sort(shown.begin(), shown.begin() + kMaxCols / 2, shown.end(),
                      [&](int64_t a, int64_t b) { return h.weights(i, a) > h.weights(i, b); });
    shown.resize(kMaxCols / 2);
    std::sort(shown.begin(), shown.end());
  }
  std::string s;
  for (std::size_t t = 0; t < shown.size(); ++t)
    s += fmt::format("{}{}{}{}", t ? " + " : "", number(h.weights(i, shown[t]), precision), times, names[shown[t]]);
  if (static_cast<int64_t>(shown.size()) < h.weights.cols)
    s += fmt::format(" + … ({} smaller terms)", h.weights.cols - static_cast<int64_t>(shown.size()));
  return s;
}

std::vector<std::string> quoted(const std::vector<std::string>& tokens) {
  std::vector<std::string> q;
  for (const auto& t : tokens) q.push_back("\"" + t + "\"");
  return q;
}

void seed003_head(std::string& out, const Explanation& e, const HeadSteps& h, int precision) {
  const auto& t = e.tokens;
  if (e.parameter_free) {
    out += "Step 1. No parameters (seed 002): each word embedding plays all three roles, Q = K = V = X\n";
  } else {
    out += "Step 1. Project inputs to queries, keys, and values: Q = X @ W_q, K = X @ W_k, V = X @ W_v\n";
  }
  matrix_block(out, "Q (queries)", h.q, t, precision);
  matrix_block(out, "K (keys)", h.k, t, precision);
  matrix_block(out, "V (values)", h.v, t, precision);
  out +=
      "\nStep 2. Compute attention scores: scores = Q @ K.T, the similarity between each query and all keys\n"
      "        (row = the word asking, column = the word answered)\n";
  // Sentences name the key columns; the seeds' examples keep the tutorials' layout.
  const std::vector<std::string> keys = e.style == "sentence" ? t : std::vector<std::string>{};
  matrix_block(out, "scores", h.scores, t, precision, keys);
  out += fmt::format(
      "\nStep 3. Scale the scores: scaled_scores = scores / np.sqrt(d_k), d_k = {}, so each score is "
      "multiplied by {}\n",
      h.q.cols, number(h.scale, precision));
  matrix_block(out, "scaled_scores", h.scaled_scores, t, precision, keys);
  out +=
      "\nStep 4. Apply the softmax function: attention_weights = softmax(scaled_scores), positive and each row "
      "sums to 1\n";
  out += "Attention weights:\n";
  matrix_block(out, "attention_weights", h.weights, t, precision, keys);
  out += "\nStep 5. Compute the weighted sum of values: output = attention_weights @ V\n";
  std::vector<std::string> values;
  for (const auto& name : quoted(t)) values.push_back("V[" + name + "]");
  for (int64_t i = 0; i < h.weights.rows; ++i) {
    if (h.weights.rows > kMaxRows && i == kMaxRows - 2) {
      out += fmt::format("  … ({} rows)\n", h.weights.rows);
      i = h.weights.rows - 2;
      continue;
    }
    out += fmt::format("  output[\"{}\"] = {}\n", t[i], weighted_sum(h, i, values, precision, "·"));
  }
  out += "Self-attention output:\n";
  matrix_block(out, "output (context vectors)", h.context, t, precision);
}

void seed000_head(std::string& out, const Explanation& e, const HeadSteps& h, int precision) {
  out += "Step 1 : Creating Query (Q), Key (K), and Value (V) Vectors\n";
  for (std::size_t i = 0; i < e.tokens.size(); ++i) {
    const auto r = static_cast<int64_t>(i);
    out += fmt::format("  {}\n", e.tokens[i]);
    out += fmt::format("    q{} = {}\n", i + 1, row_text(h.q, r, precision, number_width(h.q, precision)));
    out += fmt::format("    k{} = {}\n", i + 1, row_text(h.k, r, precision, number_width(h.k, precision)));
    out += fmt::format("    v{} = {}\n", i + 1, row_text(h.v, r, precision, number_width(h.v, precision)));
  }
  out += fmt::format(
      "\nStep 2 : Calculate Scaled-Dot Product Attention: score(t, j) = q_t · k_j / sqrt(d_k), "
      "d_k = {}\n",
      h.q.cols);
  for (int64_t i = 0; i < h.scores.rows; ++i)
    for (int64_t j = 0; j < h.scores.cols; ++j)
      out += fmt::format("  q{} · k{} = {}   / sqrt({}) = {}\n", i + 1, j + 1, number(h.scores(i, j), precision),
                         h.q.cols, number(h.scaled_scores(i, j), precision));
  out += "\nStep 3 : Create a Vector of Probabilities: softmax over each word's scaled scores\n";
  for (int64_t i = 0; i < h.weights.rows; ++i)
    out += fmt::format("  Attention scores for \"{}\": {}\n", e.tokens[i],
                       row_text(h.weights, i, precision, number_width(h.weights, precision)));
  out += "\nStep 4 : Compute the Context Vector: the weighted sum of the value vectors\n";
  std::vector<std::string> vs;
  for (std::size_t j = 0; j < e.tokens.size(); ++j) vs.push_back(fmt::format("v{}", j + 1));
  const std::vector<std::string> names = quoted(e.tokens);
  for (int64_t i = 0; i < h.weights.rows; ++i) {
    out += fmt::format("  Context vector for \"{}\": [{}]\n", e.tokens[i], weighted_sum(h, i, names, precision, " * "));
    out += fmt::format("    z{} = {} = {}\n", i + 1, weighted_sum(h, i, vs, precision, "·"),
                       row_text(h.context, i, precision, number_width(h.context, precision)));
  }
}

}  // namespace

void detail::check_explanation(const Explanation& e, std::string_view what) {
  const int64_t n = static_cast<int64_t>(e.tokens.size());
  auto fail = [&](const std::string& why) { throw Error(fmt::format("{}: {}", what, why)); };
  auto matrix = [&](const Matrix& m, const std::string& name, bool per_token, bool square) {
    if (m.rows < 0 || m.cols < 0 ||
        m.data.size() != static_cast<std::size_t>(m.rows) * static_cast<std::size_t>(m.cols))
      fail(fmt::format("{} is [{}, {}] but holds {} values", name, m.rows, m.cols, m.data.size()));
    if (m.empty()) return;
    if ((per_token && m.rows != n) || (square && m.cols != n))
      fail(fmt::format("{} is [{}, {}] for {} tokens", name, m.rows, m.cols, n));
  };
  for (const auto& [m, name] : {std::pair{&e.w_q, "w_q"},
                                {&e.w_k, "w_k"},
                                {&e.w_v, "w_v"},
                                {&e.b_q, "b_q"},
                                {&e.b_k, "b_k"},
                                {&e.b_v, "b_v"},
                                {&e.w_o, "w_o"},
                                {&e.b_o, "b_o"}})
    matrix(*m, name, false, false);
  for (const auto& [m, name] : {std::pair{&e.x, "x"}, {&e.concat, "concat"}, {&e.output, "output"}})
    matrix(*m, name, true, false);
  if (e.num_heads != static_cast<int64_t>(e.heads.size()) || e.num_kv_heads < 1 || e.num_heads % e.num_kv_heads != 0)
    fail(fmt::format("{} heads with num_heads = {} and num_kv_heads = {} (a positive divisor of it)", e.heads.size(),
                     e.num_heads, e.num_kv_heads));
  for (std::size_t h = 0; h < e.heads.size(); ++h) {
    const HeadSteps& s = e.heads[h];
    const std::string head = fmt::format("head {}: ", h + 1);
    for (const auto& [m, name] : {std::pair{&s.q, "q"}, {&s.k, "k"}, {&s.v, "v"}, {&s.context, "context"}})
      matrix(*m, head + name, true, false);
    for (const auto& [m, name] :
         {std::pair{&s.scores, "scores"}, {&s.scaled_scores, "scaled_scores"}, {&s.weights, "weights"}})
      matrix(*m, head + name, true, true);
  }
}

std::string explanation_to_text(const Explanation& e, int precision) {
  detail::check_explanation(e, "explanation_to_text");
  precision = std::clamp(precision, 1, 17);
  std::string out;
  if (!e.title.empty()) out += e.title + "\n";
  if (!e.source.empty()) out += "Inputs: " + e.source + "\n";
  out += fmt::format("Tokens ({}): ", e.tokens.size());
  for (std::size_t i = 0; i < e.tokens.size(); ++i) out += (i ? ", " : "") + ("\"" + e.tokens[i] + "\"");
  out += "\n\n";
  if (!e.x.empty()) {
    out += "Input X: one row per word (its embedding)\n";
    matrix_block(out, "X", e.x, e.tokens, precision);
  }
  if (!e.w_q.empty()) {
    out += fmt::format("Weight matrices ({}they project each embedding to a query, a key and a value)\n",
                       e.weights.empty() ? "" : e.weights + "; ");
    matrix_block(out, "W_q", e.w_q, {}, precision);
    matrix_block(out, "W_k", e.w_k, {}, precision);
    matrix_block(out, "W_v", e.w_v, {}, precision);
    if (!e.b_q.empty()) matrix_block(out, "b_q", e.b_q, {}, precision);
    if (!e.b_k.empty()) matrix_block(out, "b_k", e.b_k, {}, precision);
    if (!e.b_v.empty()) matrix_block(out, "b_v", e.b_v, {}, precision);
  }
  if (!e.x.empty() || !e.w_q.empty()) out += "\n";
  for (std::size_t h = 0; h < e.heads.size(); ++h) {
    if (e.heads.size() > 1)
      out += fmt::format("=== Head {} of {} (columns {}..{} of Q; key/value head {}) ===\n", h + 1, e.heads.size(),
                         h * e.d_k, (h + 1) * e.d_k - 1, h / (e.num_heads / e.num_kv_heads) + 1);
    if (e.style == "seed000")
      seed000_head(out, e, e.heads[h], precision);
    else
      seed003_head(out, e, e.heads[h], precision);
    out += "\n";
  }
  if (e.heads.size() > 1) {
    out += "Concatenate the heads' context vectors side by side:\n";
    matrix_block(out, "concat", e.concat, e.tokens, precision);
  }
  if (!e.w_o.empty()) {
    out += fmt::format("Output projection: output = concat @ W_o{}\n", e.b_o.empty() ? "" : " + b_o");
    matrix_block(out, "W_o", e.w_o, {}, precision);
    if (!e.b_o.empty()) matrix_block(out, "b_o", e.b_o, {}, precision);
    matrix_block(out, "output", e.output, e.tokens, precision);
  }
  return out;
}

namespace {

// One field's JSON: matrices as rows of numbers (null when empty), heads as objects.
struct FieldJson {
  nlohmann::json operator()(const Matrix& m) const { return detail::matrix_json(m); }
  nlohmann::json operator()(const std::vector<HeadSteps>& heads) const {
    nlohmann::json list = nlohmann::json::array();
    for (const HeadSteps& h : heads) list.push_back(object(h));
    return list;
  }
  template <class T>
  nlohmann::json operator()(const T& value) const {
    return value;
  }
  template <class S>
  nlohmann::json object(const S& steps) const {
    nlohmann::json j = nlohmann::json::object();
    visit_fields(steps, [&](const char* name, const auto& value) { j[name] = (*this)(value); });
    return j;
  }
};

}  // namespace

std::string explanation_to_json(const Explanation& e, int indent) {
  const nlohmann::json j = FieldJson{}.object(e);
  // Tokens are raw bytes from the user; invalid UTF-8 is replaced rather than refused.
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

namespace detail {

nlohmann::json matrix_json(const Matrix& m) {
  if (m.empty()) return nullptr;
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t i = 0; i < m.rows; ++i) {
    nlohmann::json row = nlohmann::json::array();
    for (int64_t j = 0; j < m.cols; ++j) row.push_back(m(i, j));
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace detail
}  // namespace qkv
