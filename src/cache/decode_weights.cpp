// decode_attention_weights: per-key softmax weights of the new queries, recomputed in float64
// from the cache with the decode kernel's mask definitions (MaskEval plus the StreamingLLM prefix).
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "core/half.h"
#include "kernels/mask_eval.h"
#include "qkv/decode.h"

namespace qkv {
namespace {

double stored(const PagedKV& kv, bool values, int64_t row, int64_t e) {
  const int64_t n = values ? kv.Dv : kv.D;
  const auto* pool = static_cast<const char*>(values ? kv.v : kv.k);
  const int64_t at = row * n + e;
  switch (kv.dtype) {
    case KVDtype::f32: return reinterpret_cast<const float*>(pool)[at];
    case KVDtype::bf16: return bf16_to_float(reinterpret_cast<const bf16*>(pool)[at]);
    case KVDtype::f16: return detail::half_to_float(reinterpret_cast<const uint16_t*>(pool)[at]);
    case KVDtype::i8:
      return static_cast<float>(reinterpret_cast<const int8_t*>(pool)[at]) * (values ? kv.v_scale : kv.k_scale)[row];
  }
  return 0.0;
}

}  // namespace

void decode_attention_weights(TensorView<float> weights, TensorView<const float> q, const PagedKV& kv,
                              TensorView<const float> lse, const DecodeOptions& options) {
  // decode_attention's own checks, by running it once into scratch: one decode step's cost,
  // small next to the float64 scores below.
  const int64_t B = q.rank() == 4 ? q.dim(0) : 0, H = q.rank() == 4 ? q.dim(1) : 0, N = q.rank() == 4 ? q.dim(2) : 0;
  int64_t M = 0;
  for (int64_t len : kv.seq_lens) M = std::max(M, len);
  const std::array<int64_t, 4> want{B, H, N, M};
  if (!std::ranges::equal(weights.shape(), want))
    throw Error(fmt::format("decode_attention_weights: weights has shape {}, expected [B, H, N, max len] = {}",
                            shape_string(weights.shape()), shape_string(want)));
  {
    DecodeOptions check = options;
    check.num_threads = 1;
    const std::array<int64_t, 4> oshape{B, H, N, kv.Dv};
    std::vector<float> scratch(static_cast<std::size_t>(B * H * N * kv.Dv));
    decode_attention(TensorView<float>(scratch.data(), oshape), TensorView<float>(), q, kv, check);
  }
  const AttentionShape s{B, H, kv.Hkv, N, M, kv.D, kv.Dv};
  Mask mask = options.mask;
  mask.key_lengths = kv.seq_lens;
  const detail::MaskEval eval(mask, s);
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(kv.D)));
  std::vector<double> score(static_cast<std::size_t>(M));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        const detail::KeyBand band = eval.band(b, i);
        const int64_t prefix = std::min(options.sink_tokens, band.hi);
        const int64_t g = h / (H / kv.Hkv);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < M; ++j) {
          score[j] = -std::numeric_limits<double>::infinity();
          if (j >= kv.seq_lens[b] || !((band.lo <= j && j < band.hi) || j < prefix)) continue;
          const int64_t page = kv.block_table[b * kv.max_blocks + j / kv.page_tokens];
          const int64_t row = (page * kv.Hkv + g) * kv.page_tokens + j % kv.page_tokens;
          double dot = 0;
          for (int64_t d = 0; d < kv.D; ++d) dot += static_cast<double>(q(b, h, i, d)) * stored(kv, false, row, d);
          score[j] = eval.adjust(dot * scale, b, h, i, j);
          mx = std::max(mx, score[j]);
        }
        double row_lse = -std::numeric_limits<double>::infinity();
        if (mx > -std::numeric_limits<double>::infinity()) {
          if (!lse.empty()) {
            row_lse = lse(b, h, i);
          } else {
            const double sink = options.sinks.empty() ? -std::numeric_limits<double>::infinity() : options.sinks[h];
            const double m = std::max(mx, sink);
            double sum = std::exp(sink - m);
            for (int64_t j = 0; j < M; ++j) sum += std::exp(score[j] - m);
            row_lse = m + std::log(sum);
          }
        }
        for (int64_t j = 0; j < M; ++j)
          weights(b, h, i, j) = std::isinf(row_lse) ? 0.0f : static_cast<float>(std::exp(score[j] - row_lse));
      }
}

}  // namespace qkv
