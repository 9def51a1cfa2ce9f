#include "train/lookup_task.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/blas.h"

namespace qkv::detail {
namespace {

// Standard normal by Box-Muller from the generator's bits, the same on every platform.
float normal(std::mt19937_64& rng) {
  const double u1 = static_cast<double>((rng() >> 11) + 1) * 0x1p-53;  // (0, 1]
  const double u2 = static_cast<double>(rng() >> 11) * 0x1p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

void fill_normal(Tensor<float>& t, double stddev, std::mt19937_64& rng) {
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(normal(rng) * stddev);
}

}  // namespace

LookupTask::LookupTask(const LookupConfig& c)
    : pairs_(c.pairs),
      num_keys_(c.num_keys),
      num_values_(c.num_values),
      dim_(c.embed_dim),
      keys_({c.num_keys, c.embed_dim}, "key embeddings"),
      values_({c.num_values, c.embed_dim}, "value embeddings"),
      marker_({c.embed_dim}, "query marker") {
  std::mt19937_64 rng(c.seed ^ 0x6b65792d76616c75ULL);  // a stream of its own ("key-valu")
  const double stddev = 1.0 / std::sqrt(static_cast<double>(c.embed_dim));
  fill_normal(keys_, stddev, rng);
  fill_normal(values_, stddev, rng);
  fill_normal(marker_, stddev, rng);
}

LookupBatch LookupTask::sample(int64_t batch, std::mt19937_64& rng) const {
  const int64_t T = sequence_length(), E = dim_;
  LookupBatch out{Tensor<float>({batch, T, E}, "lookup batch"), std::vector<int64_t>(static_cast<std::size_t>(batch))};
  std::vector<int64_t> keys(static_cast<std::size_t>(num_keys_));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < num_keys_; ++i) keys[i] = i;
    // The first P entries of a partial Fisher-Yates shuffle: P distinct keys in random order.
    for (int64_t i = 0; i < pairs_; ++i) std::swap(keys[i], keys[i + uniform_index(rng, num_keys_ - i)]);
    float* x = out.x.data() + b * T * E;
    int64_t query_value = 0;
    const int64_t asked = uniform_index(rng, pairs_);
    for (int64_t p = 0; p < pairs_; ++p) {
      const int64_t value = uniform_index(rng, num_values_);
      if (p == asked) query_value = value;
      for (int64_t e = 0; e < E; ++e) x[p * E + e] = keys_[keys[p] * E + e] + values_[value * E + e];
    }
    for (int64_t e = 0; e < E; ++e) x[pairs_ * E + e] = keys_[keys[asked] * E + e] + marker_[e];
    out.targets[b] = query_value;
  }
  return out;
}

ReadoutResult LookupTask::readout(const Tensor<float>& y, const std::vector<int64_t>& targets, Tensor<float>* dy,
                                  int threads) const {
  const int64_t B = static_cast<int64_t>(targets.size()), T = sequence_length(), E = dim_, V = num_values_;
  // logits [B, V] = y_query [B, E] (rows T·E apart) · valuesᵀ
  Tensor<float> logits({B, V}, "logits");
  sgemm(false, true, B, V, E, 1.0f, y.data() + pairs_ * E, T * E, values_.data(), E, 0.0f, logits.data(), V, threads);
  ReadoutResult r;
  if (dy) *dy = Tensor<float>({B, T, E}, "dy");
  for (int64_t b = 0; b < B; ++b) {
    float* row = logits.data() + b * V;
    const int64_t best = std::max_element(row, row + V) - row;
    r.correct += best == targets[b];
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - row[best]);
    const double lse = row[best] + std::log(sum);
    r.loss += lse - row[targets[b]];
    // dL/dlogits = (softmax - onehot) / B, kept in place for the product below.
    for (int64_t v = 0; v < V; ++v)
      row[v] = static_cast<float>((std::exp(double(row[v]) - lse) - (v == targets[b] ? 1.0 : 0.0)) / double(B));
  }
  r.loss /= static_cast<double>(std::max<int64_t>(B, 1));
  // dy_query [B, E] (rows T·E apart) = dlogits [B, V] · values [V, E]
  if (dy)
    sgemm(false, false, B, E, V, 1.0f, logits.data(), V, values_.data(), E, 0.0f, dy->data() + pairs_ * E, T * E,
          threads);
  return r;
}

}  // namespace qkv::detail
