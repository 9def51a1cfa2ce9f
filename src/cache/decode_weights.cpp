// decode_attention_weights: per-key softmax weights of the new queries, recomputed in float64
// from the cache with the decode kernel's mask definitions (MaskEval plus the StreamingLLM prefix).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "attention/overflow.h"
#include "attention/top_k.h"
#include "cache/decode_reads.h"
#include "core/kv_codec.h"
#include "kernels/mask_eval.h"
#include "qkv/decode.h"
#include "qkv/interrupt.h"

namespace qkv {
namespace {

double stored(const PagedKV& kv, bool values, int64_t row, int64_t e) {
  const float* scales = values ? kv.v_scale : kv.k_scale;
  return detail::kv_decode(kv.dtype, (values ? kv.v : kv.k), row * (values ? kv.Dv : kv.D) + e,
                           scales != nullptr ? scales[row] : 0.0f);
}

// Shapes checked, then each row's weights in float64, one row at a time (O(max len) memory).
class DecodeRows {
 public:
  DecodeRows(const char* who, std::span<const int64_t> out_shape, int64_t last_dim, TensorView<const float> q,
             const PagedKV& kv, TensorView<const float> lse, const DecodeOptions& options)
      : q_(q), kv_(kv), lse_(lse), options_(options) {
    // Before any size below is formed from q's (decode_attention names a q of another rank).
    if (q.rank() == 4) checked_numel(q.shape(), sizeof(float), fmt::format("{}: q", who));
    B = q.rank() == 4 ? q.dim(0) : 0, H = q.rank() == 4 ? q.dim(1) : 0, N = q.rank() == 4 ? q.dim(2) : 0;
    for (int64_t len : kv.seq_lens) M = std::max(M, len);
    const std::array<int64_t, 4> want{B, H, N, last_dim < 0 ? M : last_dim};
    if (!std::ranges::equal(out_shape, want))
      throw Error(
          fmt::format("{}: output has shape {}, expected {}", who, shape_string(out_shape), shape_string(want)));
    if (!lse.empty()) require_shape(lse.shape(), std::array<int64_t, 3>{B, H, N}, fmt::format("{}: lse", who));
    // decode_attention's own checks, by running it once into scratch: one decode step's cost,
    // small next to the float64 scores below.
    DecodeOptions check = options;
    check.attention.num_threads = 1;
    const std::array<int64_t, 4> oshape{B, H, N, kv.Dv};
    Tensor<float> scratch(oshape, fmt::format("{}: scratch", who));
    decode_attention(scratch.view(), TensorView<float>(), q, kv, check);
    // decode_attention refuses a non-finite q or bias and the cache holds finite values, so no
    // input explains a NaN or +inf lse (detail::impossible_lse).
    if (const auto bad = lse.empty() ? std::nullopt : find_non_finite(lse, true))
      detail::refuse_impossible_lse(who, fmt::format("lse[{}, {}, {}]", bad->index[0], bad->index[1], bad->index[2]),
                                    bad->value, "q and the cache",
                                    "pass the lse that decode_attention returned for this q and cache, or no lse to "
                                    "recompute it");
    read_ = detail::decode_read_spans(q, kv, options.attention.mask);
    read_.push_back(detail::named_span("lse", lse));
    mask_ = options.attention.mask;
    mask_.key_lengths = kv.seq_lens;
    eval_.emplace(mask_, AttentionShape{B, H, kv.Hkv, N, M, kv.D, kv.Dv});  // keeps a reference to mask_
    scale_ = attention_scale(options.attention.scale, kv.D);
    score_.resize(static_cast<std::size_t>(M));
  }

  int64_t B = 0, H = 0, N = 0, M = 0;

  // Throws unless `out` has places of its own, apart from every input and the outputs before it.
  template <class T>
  void require_output(const TensorView<T>& out, const char* name) {
    detail::add_output(read_, out, name);
  }

  // w[j] = exp(s_ij - lse) for the allowed keys j of row (b, h, i), else 0; j < M. Also sets
  // allowed(): the row's allowed keys in increasing order.
  const std::vector<double>& row(int64_t b, int64_t h, int64_t i) {
    // A row is the task between stop checks (qkv/interrupt.h): the caller discards the output.
    if (stop_requested(interrupt_)) throw Interrupted();
    const detail::KeyBand band = eval_->band(b, i);
    const int64_t prefix = std::min(options_.sink_tokens, band.hi);
    const int64_t g = h / (H / kv_.Hkv);
    double mx = -std::numeric_limits<double>::infinity();
    allowed_.clear();
    for (int64_t j = 0; j < M; ++j) {
      score_[j] = -std::numeric_limits<double>::infinity();
      if (j >= kv_.seq_lens[b] || !((band.lo <= j && j < band.hi) || j < prefix)) continue;
      if (eval_->keeps(b, h, i, j)) allowed_.push_back(j);
      const int64_t page = kv_.block_table[b * kv_.max_blocks + j / kv_.page_tokens];
      const int64_t at = (page * kv_.Hkv + g) * kv_.page_tokens + j % kv_.page_tokens;
      double dot = 0;
      for (int64_t d = 0; d < kv_.D; ++d) dot += static_cast<double>(q_(b, h, i, d)) * stored(kv_, false, at, d);
      score_[j] = eval_->adjust(dot * scale_, b, h, i, j);
      mx = std::max(mx, score_[j]);
    }
    double row_lse = -std::numeric_limits<double>::infinity();
    if (mx > -std::numeric_limits<double>::infinity()) {
      if (!lse_.empty()) {
        row_lse = lse_(b, h, i);
      } else {
        const double sink = options_.sinks.empty() ? -std::numeric_limits<double>::infinity() : options_.sinks[h];
        const double m = std::max(mx, sink);
        double sum = std::exp(sink - m);
        for (int64_t j = 0; j < M; ++j) sum += std::exp(score_[j] - m);
        row_lse = m + std::log(sum);
      }
    }
    // A row decode_attention gives lse = -inf has no key, as attention_weights_topk counts them.
    if (std::isinf(row_lse)) allowed_.clear();
    for (int64_t j = 0; j < M; ++j) score_[j] = std::isinf(row_lse) ? 0.0 : std::exp(score_[j] - row_lse);
    return score_;
  }

  // The allowed keys of the last row(): in the band or the StreamingLLM prefix, within the
  // sequence, and kept by the keep-mask and bias (MaskEval::keeps), whatever their weight.
  const std::vector<int64_t>& allowed() const { return allowed_; }

 private:
  InterruptScope* const interrupt_ = InterruptScope::current();
  TensorView<const float> q_;
  const PagedKV& kv_;
  TensorView<const float> lse_;
  const DecodeOptions& options_;
  Mask mask_;
  std::optional<detail::MaskEval> eval_;
  double scale_ = 1.0;
  std::vector<double> score_;
  std::vector<int64_t> allowed_;
  std::vector<detail::NamedSpan> read_;
};

}  // namespace

void decode_attention_weights(TensorView<float> weights, TensorView<const float> q, const PagedKV& kv,
                              TensorView<const float> lse, const DecodeOptions& options) {
  DecodeRows rows("decode_attention_weights", weights.shape(), -1, q, kv, lse, options);
  rows.require_output(weights, "decode_attention_weights: weights");
  for (int64_t b = 0; b < rows.B; ++b)
    for (int64_t h = 0; h < rows.H; ++h)
      for (int64_t i = 0; i < rows.N; ++i) {
        const std::vector<double>& w = rows.row(b, h, i);
        for (int64_t j = 0; j < rows.M; ++j) weights(b, h, i, j) = static_cast<float>(w[j]);
      }
}

void decode_attention_top_k(TensorView<float> values, TensorView<int64_t> indices, TensorView<const float> q,
                            const PagedKV& kv, TensorView<const float> lse, int64_t top_k,
                            const DecodeOptions& options) {
  detail::require_top_k(top_k, "decode_attention_top_k");
  if (!std::ranges::equal(values.shape(), indices.shape()))
    throw Error(fmt::format("decode_attention_top_k: values {} and indices {} must have one shape",
                            shape_string(values.shape()), shape_string(indices.shape())));
  DecodeRows rows("decode_attention_top_k", values.shape(), top_k, q, kv, lse, options);
  rows.require_output(values, "decode_attention_top_k: values");
  rows.require_output(indices, "decode_attention_top_k: indices");
  std::vector<int64_t> order;
  for (int64_t b = 0; b < rows.B; ++b)
    for (int64_t h = 0; h < rows.H; ++h)
      for (int64_t i = 0; i < rows.N; ++i) {
        const std::vector<double>& w = rows.row(b, h, i);
        order = rows.allowed();
        const int64_t k = std::min(top_k, static_cast<int64_t>(order.size()));
        detail::order_top_k(order, k, w);  // the order attention_top_k gives for prefill
        for (int64_t t = 0; t < top_k; ++t) {
          values(b, h, i, t) = t < k ? static_cast<float>(w[order[t]]) : 0.0f;
          indices(b, h, i, t) = t < k ? order[t] : -1;
        }
      }
}

}  // namespace qkv
