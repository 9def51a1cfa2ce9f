// The explanation library: the seeds' worked numbers, agreement with the float64 reference on
// random multi-head inputs, and the text/JSON renderings.
#include "qkv/explain.h"

#include <array>
#include <cmath>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/layer.h"
#include "qkv/reference.h"
#include "test_util.h"

namespace qkv {
namespace {

Matrix random_matrix(test::Rng& rng, int64_t rows, int64_t cols) {
  Matrix m(rows, cols);
  for (double& v : m.data) v = rng.uniform(-1.0, 1.0);
  return m;
}

// Copies a [n, c] slice of columns [c0, c0 + c) of m into t at [b=0, h, :, :].
void put_head(Tensor<double>& t, int64_t h, const Matrix& m, int64_t c0, int64_t c) {
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < c; ++j) t.view()(0, h, i, j) = m(i, c0 + j);
}

Matrix multiply(const Matrix& a, const Matrix& b) {
  Matrix c(a.rows, b.cols);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < b.cols; ++j)
      for (int64_t t = 0; t < a.cols; ++t) c(i, j) += a(i, t) * b(t, j);
  return c;
}

// Runs the reference on single-head q/k/v given as matrices; returns {weights, out}.
std::pair<Tensor<double>, Tensor<double>> reference(const Matrix& q, const Matrix& k, const Matrix& v) {
  const int64_t N = q.rows, M = k.rows;
  Tensor<double> tq({1, 1, N, q.cols}), tk({1, 1, M, k.cols}), tv({1, 1, M, v.cols});
  put_head(tq, 0, q, 0, q.cols);
  put_head(tk, 0, k, 0, k.cols);
  put_head(tv, 0, v, 0, v.cols);
  Tensor<double> out({1, 1, N, v.cols}), weights({1, 1, N, M});
  reference_attention_forward(out.view(), {}, weights.view(), tq.cview(), tk.cview(), tv.cview());
  return {std::move(weights), std::move(out)};
}

TEST(Explain, Seed003WeightsAndOutput) {
  const Explanation e = explain_example("seed-003");
  ASSERT_EQ(e.heads.size(), 1u);
  const HeadSteps& h = e.heads[0];
  EXPECT_EQ(e.d_k, 4);
  EXPECT_DOUBLE_EQ(h.scale, 0.5);
  // Seed 003's own numbers for its first row.
  const std::array<double, 3> w0{0.31359894, 0.35006362, 0.33633743};
  const std::array<double, 4> o0{0.3109394, 0.25997455, 0.27228657, 0.44092668};
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(h.weights(0, j), w0[j], 1e-6) << "weights[0][" << j << "]";
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(e.output(0, j), o0[j], 1e-6) << "output[0][" << j << "]";
  // Every row against the reference run on Q, K, V computed here from the seed's matrices.
  const Matrix q = multiply(e.x, e.w_q), k = multiply(e.x, e.w_k), v = multiply(e.x, e.w_v);
  auto [weights, out] = reference(q, k, v);
  for (int64_t i = 0; i < 3; ++i) {
    double sum = 0.0;
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_NEAR(h.weights(i, j), weights.cview()(0, 0, i, j), 1e-12);
      EXPECT_NEAR(h.scaled_scores(i, j), h.scores(i, j) / 2.0, 1e-15);
      sum += h.weights(i, j);
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
    for (int64_t j = 0; j < 4; ++j) EXPECT_NEAR(e.output(i, j), out.cview()(0, 0, i, j), 1e-12);
  }
}

TEST(Explain, Seed000ContextVectors) {
  const Explanation e = explain_example("playing-outside");
  ASSERT_EQ(e.tokens, (std::vector<std::string>{"Playing", "Outside"}));
  const HeadSteps& h = e.heads[0];
  EXPECT_DOUBLE_EQ(h.q(0, 0), 0.212);
  EXPECT_DOUBLE_EQ(h.k(0, 2), 0.963);
  EXPECT_DOUBLE_EQ(h.v(1, 3), 0.72);
  auto [weights, out] = reference(h.q, h.k, h.v);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 2; ++j) EXPECT_NEAR(h.weights(i, j), weights.cview()(0, 0, i, j), 1e-12);
    for (int64_t d = 0; d < 4; ++d) {
      EXPECT_NEAR(e.output(i, d), out.cview()(0, 0, i, d), 1e-12);
      // The context vector is the weighted sum of the value vectors, as seed 000 writes it.
      EXPECT_NEAR(e.output(i, d), h.weights(i, 0) * h.v(0, d) + h.weights(i, 1) * h.v(1, d), 1e-15);
    }
  }
}

TEST(Explain, MultiHeadGqaWithBiasesMatchesReference) {
  test::Rng rng("Explain.MultiHeadGqaWithBiasesMatchesReference");
  const int64_t N = 3, E = 7, H = 4, Hkv = 2, D = 3, Dv = 5, Eo = 6;
  Matrix x = random_matrix(rng, N, E), w_q = random_matrix(rng, E, H * D), w_k = random_matrix(rng, E, Hkv * D),
         w_v = random_matrix(rng, E, Hkv * Dv), b_q = random_matrix(rng, 1, H * D),
         b_k = random_matrix(rng, 1, Hkv * D), b_v = random_matrix(rng, 1, Hkv * Dv),
         w_o = random_matrix(rng, H * Dv, Eo), b_o = random_matrix(rng, 1, Eo);
  const Explanation e = explain_projections({"a", "b", "c"}, x, w_q, w_k, w_v, H, Hkv, b_q, b_k, b_v, w_o, b_o);
  ASSERT_EQ(e.heads.size(), static_cast<std::size_t>(H));
  ASSERT_EQ(e.output.rows, N);
  ASSERT_EQ(e.output.cols, Eo);

  Matrix q = multiply(x, w_q), k = multiply(x, w_k), v = multiply(x, w_v);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < q.cols; ++j) q(i, j) += b_q(0, j);
    for (int64_t j = 0; j < k.cols; ++j) k(i, j) += b_k(0, j);
    for (int64_t j = 0; j < v.cols; ++j) v(i, j) += b_v(0, j);
  }
  Tensor<double> tq({1, H, N, D}), tk({1, Hkv, N, D}), tv({1, Hkv, N, Dv});
  for (int64_t h = 0; h < H; ++h) put_head(tq, h, q, h * D, D);
  for (int64_t h = 0; h < Hkv; ++h) {
    put_head(tk, h, k, h * D, D);
    put_head(tv, h, v, h * Dv, Dv);
  }
  Tensor<double> out({1, H, N, Dv}), weights({1, H, N, N});
  reference_attention_forward(out.view(), {}, weights.view(), tq.cview(), tk.cview(), tv.cview());
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = 0; j < N; ++j) EXPECT_NEAR(e.heads[h].weights(i, j), weights.cview()(0, h, i, j), 1e-12);
      for (int64_t d = 0; d < Dv; ++d) {
        EXPECT_NEAR(e.heads[h].context(i, d), out.cview()(0, h, i, d), 1e-12);
        EXPECT_EQ(e.concat(i, h * Dv + d), e.heads[h].context(i, d));
      }
    }
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < Eo; ++c) {
      double want = b_o(0, c);
      for (int64_t t = 0; t < H * Dv; ++t) want += e.concat(i, t) * w_o(t, c);
      EXPECT_NEAR(e.output(i, c), want, 1e-12);
    }
}

TEST(Explain, ParameterFreeUsesXForQueriesKeysAndValues) {
  test::Rng rng("Explain.ParameterFreeUsesXForQueriesKeysAndValues");
  const Matrix x = random_matrix(rng, 5, 3);
  const Explanation e = explain_parameter_free({"money", "bank", "grows", "a", "b"}, x);
  EXPECT_TRUE(e.parameter_free);
  EXPECT_TRUE(e.w_q.empty());
  auto [weights, out] = reference(x, x, x);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t d = 0; d < 3; ++d) EXPECT_NEAR(e.output(i, d), out.cview()(0, 0, i, d), 1e-12);
}

TEST(Explain, LayerExplanationAgreesWithLayerForward) {
  test::Rng rng("Explain.LayerExplanationAgreesWithLayerForward");
  LayerConfig config;
  config.embed_dim = 7;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 3;
  config.value_dim = 5;
  config.bias = true;
  config.seed = rng.seed();
  MultiHeadAttention layer(config);
  for (Tensor<float>* b : {&layer.b_q, &layer.b_k, &layer.b_v, &layer.b_o})
    for (int64_t i = 0; i < b->numel(); ++i) (*b)[i] = static_cast<float>(rng.uniform(-0.5, 0.5));
  const int64_t N = 5;
  const Tensor<float> x = rng.normal32({N, 7});
  const Tensor<float> y = layer.forward(x.cview());
  const Explanation e = explain_layer({"a", "b", "c", "d", "e"}, x.cview(), layer);
  ASSERT_EQ(e.output.rows, y.dim(0));
  ASSERT_EQ(e.output.cols, y.dim(1));
  EXPECT_EQ(e.num_kv_heads, 2);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < y.dim(1); ++j)
      EXPECT_NEAR(e.output(i, j), y.cview()(i, j), 1e-5 * (1.0 + std::abs(e.output(i, j)))) << i << ", " << j;

  LayerConfig free_config;
  free_config.embed_dim = 7;
  free_config.parameter_free = true;
  const MultiHeadAttention free_layer(free_config);
  const Tensor<float> yf = free_layer.forward(x.cview());
  const Explanation ef = explain_layer({"a", "b", "c", "d", "e"}, x.cview(), free_layer);
  EXPECT_TRUE(ef.parameter_free);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < 7; ++j)
      EXPECT_NEAR(ef.output(i, j), yf.cview()(i, j), 1e-5 * (1.0 + std::abs(yf.cview()(i, j))));
}

TEST(Explain, TextUsesTheSeedsStepsAndNumbers) {
  const std::string text = explanation_to_text(explain_example("seed-003"));
  for (const char* want :
       {"Project inputs to queries, keys, and values", "scores = Q @ K.T", "np.sqrt(d_k)", "Apply the softmax function",
        "Compute the weighted sum of values", "Attention weights:", "Self-attention output:", "0.31359894",
        "0.35006362", "0.33633743", "0.31093940", "0.25997455", "0.27228657", "0.44092668"})
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want << "\n" << text;

  const Explanation p = explain_example("playing-outside");
  const std::string t0 = explanation_to_text(p);
  const std::string sum = "Context vector for \"Playing\": [" + fmt::format("{:.8f}", p.heads[0].weights(0, 0)) +
                          " * \"Playing\" + " + fmt::format("{:.8f}", p.heads[0].weights(0, 1)) + " * \"Outside\"]";
  EXPECT_NE(t0.find(sum), std::string::npos) << t0;
  EXPECT_NE(t0.find("q1 = [ 0.21200000 0.04000000 0.63000000 0.36000000]"), std::string::npos) << t0;
}

TEST(Explain, LongSentencesAreShownInPart) {
  test::Rng rng("Explain.LongSentencesAreShownInPart");
  const int64_t N = 15;
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < N; ++i) tokens.push_back(fmt::format("w{}", i));
  const Explanation e = explain_parameter_free(tokens, random_matrix(rng, N, 40));
  const std::string text = explanation_to_text(e, 4);
  EXPECT_NE(text.find("(15 rows)"), std::string::npos);
  EXPECT_NE(text.find("(40 columns)"), std::string::npos);
  EXPECT_NE(text.find("+ … (10 smaller terms)"), std::string::npos);
  EXPECT_LT(text.size(), 20000u);
  // The JSON keeps everything.
  const nlohmann::json j = nlohmann::json::parse(explanation_to_json(e));
  EXPECT_EQ(j["heads"][0]["weights"].size(), static_cast<std::size_t>(N));
  EXPECT_EQ(j["x"][0].size(), 40u);
}

TEST(Explain, JsonHasEveryStep) {
  const Explanation e = explain_example("seed-003");
  const nlohmann::json j = nlohmann::json::parse(explanation_to_json(e));
  EXPECT_EQ(j["tokens"].size(), 3u);
  EXPECT_EQ(j["d_k"], 4);
  EXPECT_TRUE(j["w_o"].is_null());
  const auto& h = j["heads"][0];
  for (const char* key : {"q", "k", "v", "scores", "scaled_scores", "weights", "context"})
    ASSERT_TRUE(h[key].is_array()) << key;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t jj = 0; jj < 3; ++jj) EXPECT_EQ(h["weights"][i][jj].get<double>(), e.heads[0].weights(i, jj));
  EXPECT_EQ(j["output"][0][3].get<double>(), e.output(0, 3));
}

TEST(Explain, RefusesBadInput) {
  EXPECT_THROW(explain_example("no-such-example"), Error);
  Matrix x(2, 3), w(3, 4), w_bad(2, 4);
  EXPECT_THROW(explain_projections({"a", "b"}, x, w_bad, w, w, 1, 1), Error);  // W_q rows != E
  EXPECT_THROW(explain_projections({"a", "b"}, x, w, w, w, 3, 1), Error);      // 4 columns, 3 heads
  EXPECT_THROW(explain_projections({"a"}, x, w, w, w, 1, 1), Error);           // tokens != rows
  EXPECT_THROW(explain_qkv({}, Matrix(), Matrix(), Matrix()), Error);          // nothing to explain
  EXPECT_THROW(Matrix::from_rows({{1.0, 2.0}, {3.0}}), Error);
  // std::length_error escaped for a negative size; a view without data read as "no tokens".
  test::expect_error([] { Matrix(-1, 3); }, {"Matrix: negative dimension in shape [-1, 3]"});
  const std::array<int64_t, 2> shape{2, 4};
  test::expect_error(
      [&] {
        explain_layer({"a", "b"}, TensorView<const float>(nullptr, shape), MultiHeadAttention(LayerConfig{4}));
      },
      {"X: a null data pointer for shape [2, 4]"});
  // The empty tensor's copy is empty, not a scalar.
  const Tensor<float> empty, copy = empty.clone();
  EXPECT_EQ(copy.rank(), 0);
  EXPECT_EQ(copy.data(), nullptr);
  EXPECT_EQ(copy.numel(), empty.numel());
}

// A step past float64's range from finite inputs is refused, naming it, by the kernels' overflow
// rule; NaN weights from finite input were shown before. Non-finite inputs still pass through.
TEST(Explain, RefusesAStepThatOverflowsFloat64) {
  auto full = [](int64_t r, int64_t c, double value) {
    Matrix m(r, c);
    std::fill(m.data.begin(), m.data.end(), value);
    return m;
  };
  test::expect_error(
      [&] {
        explain_parameter_free({"a", "b"}, full(2, 2, 1e300));
      },
      {"explain: the output overflowed float64 although X are finite (the scores Q·Kᵀ of head 0 "
       "beyond 1.8e308); scale the inputs down"});
  test::expect_error(
      [&] {
        explain_qkv({"a", "b"}, full(2, 2, 1e200), full(2, 2, 1e200), full(2, 2, 1));
      },
      {"although q, k and v are finite (the scores Q·Kᵀ of head 0 beyond 1.8e308)"});
  test::expect_error(
      [&] {
        explain_projections({"a", "b"}, full(2, 2, 1e200), full(2, 2, 1e200), full(2, 2, 1), full(2, 2, 1), 1, 1);
      },
      {"although X, the weights and the biases are finite (Q of head 0 beyond 1.8e308)"});
  test::expect_error(
      [&] {
        explain_projections({"a", "b"}, full(2, 2, 1), full(2, 2, 1), full(2, 2, 1), full(2, 2, 1), 1, 1, {}, {}, {},
                            full(2, 2, 1e308));
      },
      {"(the output beyond 1.8e308)"});
  Matrix nan_x = full(2, 2, 1e300);
  nan_x(0, 0) = std::nan("");
  EXPECT_TRUE(std::isnan(explain_parameter_free({"a", "b"}, nan_x).heads[0].weights(0, 0)));
}

}  // namespace
}  // namespace qkv
