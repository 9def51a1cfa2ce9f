#include "qkv/weights.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "attention/row_logits.h"

namespace qkv {
namespace {

struct RowProblem {
  AttentionShape s;
  double scale = 1.0;
  int64_t group = 1;
};

RowProblem check(TensorView<const float> q, TensorView<const float> k, TensorView<const float> lse,
                 std::span<const int64_t> rows, const AttentionOptions& options) {
  // Weights do not involve v: check q and k with a stand-in v of the right [B, Hkv, M].
  const std::array<int64_t, 4> v_shape{k.rank() == 4 ? k.dim(0) : 0, k.rank() == 4 ? k.dim(1) : 0,
                                       k.rank() == 4 ? k.dim(2) : 0, 1};
  RowProblem p;
  p.s = check_attention_shapes(q.shape(), k.shape(), v_shape, options);
  p.scale = attention_scale(options.scale, p.s.D);
  p.group = p.s.H / p.s.Hkv;
  const std::array<int64_t, 3> want_lse{p.s.B, p.s.H, p.s.N};
  if (!lse.empty()) require_shape(lse.shape(), want_lse, "lse");
  for (std::size_t r = 0; r < rows.size(); ++r)
    if (rows[r] < 0 || rows[r] >= p.s.N)
      throw Error(fmt::format("rows[{}] = {} is outside [0, {})", r, rows[r], p.s.N));
  return p;
}

// Fills w[j] (j in [0, M)) with the weights of query row i of (b, h); returns false if the row
// is fully masked (then w is all 0).
bool row_weights(std::vector<double>& w, const RowProblem& p, const detail::MaskEval& mask,
                 TensorView<const float> q, TensorView<const float> k, TensorView<const float> lse, int64_t b,
                 int64_t h, int64_t i) {
  std::fill(w.begin(), w.end(), 0.0);
  const detail::RowLogits row = detail::row_logits(w.data(), nullptr, mask, q, k, p.scale, b, h, h / p.group, i);
  if (row.masked) {
    std::fill(w.begin(), w.end(), 0.0);
    return false;
  }
  double row_lse = 0.0;
  if (!lse.empty()) {
    row_lse = lse(b, h, i);
  } else {
    double sum = 0.0;
    for (int64_t j = row.band.lo; j < row.band.hi; ++j) sum += std::exp(w[j] - row.max);
    row_lse = row.max + std::log(sum);
  }
  for (int64_t j = row.band.lo; j < row.band.hi; ++j) w[j] = std::exp(w[j] - row_lse);
  return true;
}

// Runs fn(b, h, r, w, live) for every chosen row on the option's threads, each row on one thread;
// live is false for a fully masked row.
template <class Fn>
void for_each_row(const RowProblem& p, std::span<const int64_t> rows, const AttentionOptions& options,
                  TensorView<const float> q, TensorView<const float> k, TensorView<const float> lse, Fn fn) {
  const detail::MaskEval mask(options.mask, p.s);
  const int64_t R = static_cast<int64_t>(rows.size());
  const int64_t items = p.s.B * p.s.H * R;
  const int threads = options.num_threads > 0 ? options.num_threads : default_num_threads();
#pragma omp parallel num_threads(static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, items))))
  {
    std::vector<double> w(static_cast<std::size_t>(p.s.M));
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t r = item % R, h = item / R % p.s.H, b = item / R / p.s.H;
      const bool live = row_weights(w, p, mask, q, k, lse, b, h, rows[r]);
      fn(b, h, r, w, live);
    }
  }
}

}  // namespace

void attention_weights_rows(TensorView<float> weights, TensorView<const float> q, TensorView<const float> k,
                            TensorView<const float> lse, std::span<const int64_t> rows,
                            const AttentionOptions& options) {
  const RowProblem p = check(q, k, lse, rows, options);
  const int64_t R = static_cast<int64_t>(rows.size());
  require_shape(weights.shape(), std::array<int64_t, 4>{p.s.B, p.s.H, R, p.s.M}, "weights");
  for_each_row(p, rows, options, q, k, lse, [&](int64_t b, int64_t h, int64_t r, const std::vector<double>& w, bool) {
    for (int64_t j = 0; j < p.s.M; ++j) weights(b, h, r, j) = static_cast<float>(w[j]);
  });
}

void attention_weights_topk(TensorView<float> values, TensorView<int64_t> indices, TensorView<const float> q,
                            TensorView<const float> k, TensorView<const float> lse, std::span<const int64_t> rows,
                            int64_t topk, const AttentionOptions& options) {
  if (topk < 1) throw Error(fmt::format("topk must be at least 1, got {}", topk));
  const RowProblem p = check(q, k, lse, rows, options);
  const int64_t R = static_cast<int64_t>(rows.size());
  require_shape(values.shape(), std::array<int64_t, 4>{p.s.B, p.s.H, R, topk}, "top-k values");
  require_shape(indices.shape(), std::array<int64_t, 4>{p.s.B, p.s.H, R, topk}, "top-k indices");
  const detail::MaskEval mask(options.mask, p.s);
  for_each_row(p, rows, options, q, k, lse,
               [&](int64_t b, int64_t h, int64_t r, const std::vector<double>& w, bool live) {
    const int64_t i = rows[r];
    const detail::KeyBand band = mask.band(b, i);
    // Allowed keys: the band minus keys the keep-mask or a -inf bias removes (adjust(0) = -inf),
    // so a weight that merely underflowed to 0 still counts as allowed.
    std::vector<int64_t> keys;
    for (int64_t j = band.lo; live && j < band.hi; ++j)
      if (std::isfinite(mask.adjust(0.0, b, h, i, j))) keys.push_back(j);
    const int64_t n = std::min<int64_t>(topk, static_cast<int64_t>(keys.size()));
    std::partial_sort(keys.begin(), keys.begin() + n, keys.end(), [&](int64_t x, int64_t y) {
      return w[x] > w[y] || (w[x] == w[y] && x < y);
    });
    for (int64_t t = 0; t < topk; ++t) {
      values(b, h, r, t) = t < n ? static_cast<float>(w[keys[t]]) : 0.0f;
      indices(b, h, r, t) = t < n ? keys[t] : -1;
    }
  });
}

}  // namespace qkv
