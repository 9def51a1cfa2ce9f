// Explanations: every intermediate step of self-attention for a short sentence, computed in
// float64, as a plain data struct (for the CLI, the HTML renderer and the Python module) with
// text and JSON renderings in the seeds' own terms.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

class MultiHeadAttention;

// A dense row-major float64 matrix. Empty (0 x 0) when a step does not apply.
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> data;  // rows * cols values, row-major

  Matrix() = default;
  // Throws qkv::Error for a negative size or one past 2^62 bytes.
  Matrix(int64_t r, int64_t c)
      : rows(r),
        cols(c),
        data(static_cast<std::size_t>(checked_numel(std::array<int64_t, 2>{r, c}, sizeof(double), "Matrix")), 0.0) {}
  // From nested rows; every row must have the same length (else qkv::Error).
  static Matrix from_rows(const std::vector<std::vector<double>>& rows);
  // Converts a rank-2 view; throws qkv::Error naming `what` for another rank.
  static Matrix from_view(TensorView<const float> view, const std::string& what);

  bool empty() const { return rows == 0 || cols == 0; }
  double& operator()(int64_t i, int64_t j) { return data[static_cast<std::size_t>(i * cols + j)]; }
  double operator()(int64_t i, int64_t j) const { return data[static_cast<std::size_t>(i * cols + j)]; }
};

// The steps of one attention head. N tokens, D = d_k, Dv value width.
struct HeadSteps {
  Matrix q;              // [N, D]  queries  Q = X·W_q (+ b_q), this head's columns
  Matrix k;              // [N, D]  keys     K = X·W_k (+ b_k)
  Matrix v;              // [N, Dv] values   V = X·W_v (+ b_v)
  Matrix scores;         // [N, N]  raw scores Q·Kᵀ
  double scale = 0.0;    // 1/√d_k
  Matrix scaled_scores;  // [N, N]  scores · scale
  Matrix weights;        // [N, N]  softmax of each row of scaled_scores (rows sum to 1)
  Matrix context;        // [N, Dv] context vectors weights·V
};

// Everything an explanation shows. Which inputs are present depends on where it came from:
// a worked example from X and W's has x and w_*; seed 000's example starts from q/k/v (x empty);
// the parameter-free mode (seed 002) has x but no W's (Q = K = V = X).
struct Explanation {
  std::string title;   // one line: what is being explained
  std::string source;  // where the inputs came from (seed, file, random seed)
  std::string style;   // "seed003", "seed000" or "sentence": the wording of the text
  // Where W_q, W_k, W_v come from, shown next to them: "learned (file)" only for loaded or trained
  // weights, "random (seed S)" for a seeded initialization, "given by ..." for a worked example.
  // Empty: no claim is made.
  std::string weights;
  std::vector<std::string> tokens;  // one per row of X
  Matrix x;                         // [N, E] static embeddings, or empty
  Matrix w_q, w_k, w_v;             // [E, H·D], [E, Hkv·D], [E, Hkv·Dv], or empty
  Matrix b_q, b_k, b_v;             // [1, ·] biases, or empty
  Matrix w_o, b_o;                  // output projection [H·Dv, E_out] and bias [1, E_out], or empty
  bool parameter_free = false;      // Q = K = V = X
  int64_t num_heads = 1;            // H
  int64_t num_kv_heads = 1;         // Hkv (head h uses key/value head h / (H / Hkv))
  int64_t d_k = 0;                  // D
  std::vector<HeadSteps> heads;     // H entries
  Matrix concat;                    // [N, H·Dv] context vectors of all heads, side by side
  Matrix output;                    // [N, ·] final output: concat·W_o + b_o, or concat without W_o
  bool residual = false;            // output also adds X itself (a layer trained with a residual)
};

// Calls f(name, value) for every field, in the order of the serialised forms (the CLI's JSON,
// Python's dict): the one list of field names both are written from.
template <class F>
void visit_fields(const HeadSteps& h, F&& f) {
  f("q", h.q), f("k", h.k), f("v", h.v), f("scores", h.scores), f("scale", h.scale);
  f("scaled_scores", h.scaled_scores), f("weights", h.weights), f("context", h.context);
}
template <class F>
void visit_fields(const Explanation& e, F&& f) {
  f("title", e.title), f("source", e.source), f("style", e.style), f("weights", e.weights), f("tokens", e.tokens);
  f("x", e.x), f("w_q", e.w_q), f("w_k", e.w_k), f("w_v", e.w_v), f("b_q", e.b_q), f("b_k", e.b_k), f("b_v", e.b_v);
  f("w_o", e.w_o), f("b_o", e.b_o), f("parameter_free", e.parameter_free), f("num_heads", e.num_heads);
  f("num_kv_heads", e.num_kv_heads), f("d_k", e.d_k), f("heads", e.heads), f("concat", e.concat);
  f("output", e.output), f("residual", e.residual);
}

// Names accepted by explain_example(): "seed-003" (the default of `qkv explain`) and
// "playing-outside" (seed 000's q/k/v vectors for "Playing Outside").
std::vector<std::string> example_names();

// A built-in worked example by name. Throws qkv::Error listing the names for an unknown one.
Explanation explain_example(std::string_view name);

// Attention from given projections: X [N, E], W_q [E, H·D], W_k [E, Hkv·D], W_v [E, Hkv·Dv]
// (biases and W_o optional: pass empty matrices). Throws qkv::Error on inconsistent shapes.
// The caller fills title/source/style of the result as it likes.
Explanation explain_projections(std::vector<std::string> tokens, Matrix x, Matrix w_q, Matrix w_k, Matrix w_v,
                                int64_t num_heads, int64_t num_kv_heads, Matrix b_q = {}, Matrix b_k = {},
                                Matrix b_v = {}, Matrix w_o = {}, Matrix b_o = {});

// Single-head attention from given q [N, D], k [N, D], v [N, Dv] (no X, no W's).
Explanation explain_qkv(std::vector<std::string> tokens, Matrix q, Matrix k, Matrix v);

// Parameter-free attention (seed 002): Q = K = V = X [N, E], d_k = E.
Explanation explain_parameter_free(std::vector<std::string> tokens, Matrix x);

// Variations of the softmax step the tutorials discuss (the live explorer, `qkv serve`, toggles
// them). The defaults are what attention computes; other values no longer match layer.forward().
struct StepOptions {
  // false: weights = softmax(scores) without 1/√d_k (each head's `scale` is then 1, and
  // scaled_scores equals scores), showing how large scores saturate the softmax.
  bool scaled = true;
  // true: query i attends only to keys 0..i (a decoder's causal mask). scaled_scores keep every
  // value; the weights of the masked keys are exactly 0 and each row still sums to 1.
  bool causal = false;
};

// Explains what `layer` computes for x [N, E] (its weights converted to float64; parameter-free
// layers give explain_parameter_free). With default `options` the result agrees with
// layer.forward() to fp32 rounding.
Explanation explain_layer(std::vector<std::string> tokens, TensorView<const float> x, const MultiHeadAttention& layer,
                          const StepOptions& options = {});

// A readable step-by-step print. `precision` is the number of decimals shown.
std::string explanation_to_text(const Explanation& e, int precision = 8);

// The same steps as a JSON object (matrices as arrays of rows, full float64 precision).
// Keys: title, source, style, weights, tokens, x, w_q, w_k, w_v, b_q, b_k, b_v, w_o, b_o, parameter_free,
// num_heads, num_kv_heads, d_k, heads: [{q, k, v, scores, scale, scaled_scores, weights, context}],
// concat, output. Empty matrices are null.
std::string explanation_to_json(const Explanation& e, int indent = 2);

}  // namespace qkv
