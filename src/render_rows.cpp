// Attention weights one query row at a time, for pages of inputs too long for an N×M matrix:
// a row's scores live in an O(M) buffer per thread, and only the top k leave it.
#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "qkv/error.h"
#include "qkv/render.h"

namespace qkv {
namespace {

struct RowShape {
  int64_t H = 0, Hkv = 0, N = 0, M = 0, D = 0;
  double scale = 0.0;
};

RowShape check_rows(TensorView<const float> q, TensorView<const float> k, std::optional<double> scale) {
  if (q.rank() != 3 || k.rank() != 3)
    throw Error(fmt::format("attention rows: q must be [H, N, D] and k [Hkv, M, D], got {} and {}",
                            shape_string(q.shape()), shape_string(k.shape())));
  RowShape s{q.dim(0), k.dim(0), q.dim(1), k.dim(1), q.dim(2), 0.0};
  if (k.dim(2) != s.D)
    throw Error(fmt::format("attention rows: q has D = {} but k has D = {}", s.D, k.dim(2)));
  if (s.D == 0) throw Error("attention rows: D = 0");
  if (s.Hkv == 0 || s.H % s.Hkv != 0)
    throw Error(fmt::format("attention rows: H = {} is not a multiple of Hkv = {}", s.H, s.Hkv));
  if (s.M == 0) throw Error("attention rows: no keys");
  if (s.M > INT32_MAX) throw Error(fmt::format("attention rows: M = {} keys is more than 2^31 - 1", s.M));
  s.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(s.D));
  if (!std::isfinite(s.scale)) throw Error("attention rows: the scale is not finite");
  return s;
}

// The keys as contiguous float64 rows [Hkv, M, D]: O(M·D) memory, so every row's scores stream
// through memory in order instead of through the view's strides.
std::vector<double> contiguous_keys(TensorView<const float> k, const RowShape& s) {
  std::vector<double> out(static_cast<std::size_t>(s.Hkv * s.M * s.D));
  std::size_t o = 0;
  for (int64_t h = 0; h < s.Hkv; ++h)
    for (int64_t j = 0; j < s.M; ++j)
      for (int64_t d = 0; d < s.D; ++d) out[o++] = k(h, j, d);
  return out;
}

// q: [H, N, D], keys: [Hkv, M, D] contiguous -> scores [M] of query `row` of head `head`, scaled.
void row_scores(std::vector<double>& scores, std::vector<double>& qrow, TensorView<const float> q,
                const std::vector<double>& keys, const RowShape& s, int64_t head, int64_t row) {
  const double* kh = keys.data() + (head / (s.H / s.Hkv)) * s.M * s.D;
  qrow.resize(static_cast<std::size_t>(s.D));
  for (int64_t d = 0; d < s.D; ++d) qrow[static_cast<std::size_t>(d)] = q(head, row, d);
  scores.resize(static_cast<std::size_t>(s.M));
  for (int64_t j = 0; j < s.M; ++j) {
    const double* kj = kh + j * s.D;
    // Four partial sums keep the multiply-adds independent (the order is fixed, so results are too).
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t d = 0;
    for (; d + 4 <= s.D; d += 4)
      for (int u = 0; u < 4; ++u) acc[u] += qrow[static_cast<std::size_t>(d + u)] * kj[d + u];
    for (; d < s.D; ++d) acc[0] += qrow[static_cast<std::size_t>(d)] * kj[d];
    scores[static_cast<std::size_t>(j)] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) * s.scale;
  }
}

// Turns scores into softmax weights in place; the normalizer is `lse` if finite, else the row's own.
void normalize(std::vector<double>& w, double lse) {
  if (!std::isfinite(lse)) {
    const double m = *std::max_element(w.begin(), w.end());
    double sum = 0.0;
    for (double x : w) sum += std::exp(x - m);
    lse = m + std::log(sum);
  }
  for (double& x : w) x = std::exp(x - lse);
}

}  // namespace

std::vector<double> attention_row(TensorView<const float> q, TensorView<const float> k, int64_t head, int64_t row,
                                  std::optional<double> scale) {
  const RowShape s = check_rows(q, k, scale);
  if (head < 0 || head >= s.H || row < 0 || row >= s.N)
    throw Error(fmt::format("attention rows: head {} row {} is outside H = {}, N = {}", head, row, s.H, s.N));
  std::vector<double> w, qrow;
  row_scores(w, qrow, q, contiguous_keys(k, s), s, head, row);
  normalize(w, NAN);
  return w;
}

TopKWeights attention_top_k(TensorView<const float> q, TensorView<const float> k, int64_t top_k,
                            std::optional<double> scale, TensorView<const float> lse) {
  const RowShape s = check_rows(q, k, scale);
  if (top_k < 1) throw Error(fmt::format("top-k: k must be at least 1, got {}", top_k));
  if (!lse.empty() && (lse.rank() != 2 || lse.dim(0) != s.H || lse.dim(1) != s.N))
    throw Error(fmt::format("top-k: lse must be [H, N] = [{}, {}], got {}", s.H, s.N, shape_string(lse.shape())));
  TopKWeights t;
  t.num_heads = s.H;
  t.rows = s.N;
  t.cols = s.M;
  t.k = std::min(top_k, s.M);
  const std::size_t kk = static_cast<std::size_t>(t.k);
  t.index.resize(static_cast<std::size_t>(s.H * s.N) * kk);
  t.weight.resize(t.index.size());
  t.rest.resize(static_cast<std::size_t>(s.H * s.N));
  const int64_t total = s.H * s.N;
  const std::vector<double> keys = contiguous_keys(k, s);
#pragma omp parallel
  {
    std::vector<double> w, qrow;
    std::vector<int32_t> order(static_cast<std::size_t>(s.M));
#pragma omp for schedule(dynamic, 16)
    for (int64_t hr = 0; hr < total; ++hr) {
      const int64_t h = hr / s.N, i = hr % s.N;
      row_scores(w, qrow, q, keys, s, h, i);
      normalize(w, lse.empty() ? NAN : static_cast<double>(lse(h, i)));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + t.k, order.end(), [&w](int32_t a, int32_t b) {
        const double wa = w[static_cast<std::size_t>(a)], wb = w[static_cast<std::size_t>(b)];
        return wa > wb || (wa == wb && a < b);
      });
      double kept = 0.0;
      for (std::size_t r = 0; r < kk; ++r) {
        t.index[static_cast<std::size_t>(hr) * kk + r] = order[r];
        kept += t.weight[static_cast<std::size_t>(hr) * kk + r] = w[static_cast<std::size_t>(order[r])];
      }
      double all = 0.0;
      for (double x : w) all += x;
      t.rest[static_cast<std::size_t>(hr)] = std::max(0.0, all - kept);
    }
  }
  return t;
}

}  // namespace qkv
