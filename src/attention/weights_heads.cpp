// The pages' row-wise weights, in the renderer's shapes ([H, N, D] views, one sentence), on top of
// attention_weights_rows / attention_weights_topk (weights.h): one query row at a time, O(M)
// memory per thread, so an N×M matrix never exists.
#include <algorithm>
#include <array>
#include <climits>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "attention/output_checks.h"
#include "attention/top_k.h"
#include "qkv/attention_options.h"
#include "qkv/error.h"
#include "qkv/weights.h"

namespace qkv {
namespace {

// [X, Y, Z] -> [1, X, Y, Z]: the batch of one that weights.h takes.
TensorView<const float> batch_of_one(TensorView<const float> t) {
  const std::array<int64_t, 4> shape{1, t.dim(0), t.dim(1), t.dim(2)},
      strides{0, t.stride(0), t.stride(1), t.stride(2)};
  return TensorView<const float>(t.data(), shape, strides);
}

void check_rows(TensorView<const float> q, TensorView<const float> k) {
  // Before any element's address is taken: &q(head, 0, 0) of a null view is not null for head > 0.
  detail::require_data(q, "attention rows: q");
  detail::require_data(k, "attention rows: k");
  if (q.rank() != 3 || k.rank() != 3)
    throw Error(fmt::format("attention rows: q must be [H, N, D] and k [Hkv, M, D], got {} and {}",
                            shape_string(q.shape()), shape_string(k.shape())));
  if (k.dim(2) != q.dim(2))
    throw Error(fmt::format("attention rows: q has D = {} but k has D = {}", q.dim(2), k.dim(2)));
  require_head_groups(q.dim(0), k.dim(0), "attention rows");
  if (k.dim(1) == 0) throw Error("attention rows: no keys");
  if (k.dim(1) > INT32_MAX) throw Error(fmt::format("attention rows: M = {} keys is more than 2^31 - 1", k.dim(1)));
}

AttentionOptions with_scale(std::optional<double> scale) {
  AttentionOptions o;
  o.scale = scale;
  return o;
}

}  // namespace

std::vector<double> attention_row(TensorView<const float> q, TensorView<const float> k, int64_t head, int64_t row,
                                  std::optional<double> scale) {
  check_rows(q, k);
  const int64_t H = q.dim(0), N = q.dim(1), M = k.dim(1);
  if (head < 0 || head >= H || row < 0 || row >= N)
    throw Error(fmt::format("attention rows: head {} row {} is outside H = {}, N = {}", head, row, H, N));
  // Only this head and its key head: [1, 1, N, D] against [1, 1, M, D].
  const int64_t kh = head / (H / k.dim(0));
  const std::array<int64_t, 4> qs{1, 1, N, q.dim(2)}, qst{0, 0, q.stride(1), q.stride(2)};
  const std::array<int64_t, 4> ks{1, 1, M, k.dim(2)}, kst{0, 0, k.stride(1), k.stride(2)};
  Tensor<float> w({1, 1, 1, M});
  const int64_t rows[] = {row};
  attention_weights_rows(w.view(), TensorView<const float>(&q(head, 0, 0), qs, qst),
                         TensorView<const float>(&k(kh, 0, 0), ks, kst), {}, rows, with_scale(scale));
  return std::vector<double>(w.data(), w.data() + M);
}

TopKWeights attention_top_k(TensorView<const float> q, TensorView<const float> k, int64_t top_k,
                            std::optional<double> scale, TensorView<const float> lse) {
  check_rows(q, k);
  detail::require_top_k(top_k, "attention_top_k");
  const int64_t H = q.dim(0), N = q.dim(1), M = k.dim(1);
  if (!lse.empty() && (lse.rank() != 2 || lse.dim(0) != H || lse.dim(1) != N))
    throw Error(fmt::format("top-k: lse must be [H, N] = [{}, {}], got {}", H, N, shape_string(lse.shape())));
  TopKWeights t;
  t.num_heads = H;
  t.rows = N;
  t.cols = M;
  t.k = std::min(top_k, M);
  std::vector<int64_t> rows(static_cast<std::size_t>(N));
  std::iota(rows.begin(), rows.end(), 0);
  Tensor<float> values({1, H, N, t.k});
  Tensor<int64_t> indices({1, H, N, t.k});
  TensorView<const float> lse4;
  if (!lse.empty()) {
    const std::array<int64_t, 3> shape{1, H, N}, strides{0, lse.stride(0), lse.stride(1)};
    lse4 = TensorView<const float>(lse.data(), shape, strides);
  }
  attention_weights_topk(values.view(), indices.view(), batch_of_one(q), batch_of_one(k), lse4, rows, t.k,
                         with_scale(scale));
  t.index.assign(indices.data(), indices.data() + indices.numel());
  t.weight.assign(values.data(), values.data() + values.numel());
  t.rest.resize(static_cast<std::size_t>(H * N));
  for (std::size_t r = 0; r < t.rest.size(); ++r) {
    double kept = 0.0;
    for (int64_t s = 0; s < t.k; ++s) kept += t.weight[r * static_cast<std::size_t>(t.k) + static_cast<std::size_t>(s)];
    t.rest[r] = std::max(0.0, 1.0 - kept);
  }
  return t;
}

}  // namespace qkv
