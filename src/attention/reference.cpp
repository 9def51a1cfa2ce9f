#include "qkv/reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "attention/output_checks.h"
#include "attention/overflow.h"
#include "attention/row_logits.h"
#include "qkv/interrupt.h"

namespace qkv {

// q: [B, H, N, D], k: [B, Hkv, M, D], v: [B, Hkv, M, Dv] -> out: [B, H, N, Dv], lse: [B, H, N],
// weights: [B, H, N, M]. One row of scores at a time, in float64, in a fixed order.
void reference_attention_forward(TensorView<double> out, TensorView<double> lse, TensorView<double> weights,
                                 TensorView<const double> q, TensorView<const double> k, TensorView<const double> v,
                                 const AttentionOptions& options) {
  const AttentionShape s = check_attention_shapes(q.shape(), k.shape(), v.shape(), options);
  std::vector<detail::NamedSpan> read = detail::read_spans(q, k, v, options.mask);
  detail::add_output(read, out, "out");
  detail::add_output(read, lse, "lse");
  detail::require_output(weights, "weights", read);
  const double scale = attention_scale(options.scale, s.D);
  const detail::MaskEval mask(options.mask, s);
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  std::vector<double> row(static_cast<std::size_t>(s.M)), weighted(options.dropout.active() ? row.size() : 0);
  const double drop_scale = dropout_scale(options.dropout);
  bool nonfinite = false, emptied = false;  // as the fused kernel flags its rows (overflow.h)
  detail::for_each_query_row(s, [&](int64_t b, int64_t h, int64_t hk, int64_t i) {
    const detail::RowLogits r = detail::row_logits(row.data(), nullptr, mask, q, k, scale, b, h, hk, i);
    const detail::KeyBand band = r.band;
    const bool masked = r.masked;
    const double row_max = r.max;
    const double sum = masked ? 0.0 : detail::exp_in_place(row.data(), r);
    // Dropout (qkv/dropout.h): the dropped weights leave the product, the kept ones are scaled.
    if (options.dropout.active() && !masked) {
      const DropoutRow drop(options.dropout, s.H, b, h, i);
      for (int64_t j = band.lo; j < band.hi; ++j) weighted[j] = drop.keep(j) ? row[j] * drop_scale : 0.0;
    }
    const double* pv = options.dropout.active() ? weighted.data() : row.data();
    for (int64_t e = 0; e < s.Dv; ++e) {
      double acc = 0.0;
      if (!masked)
        for (int64_t j = band.lo; j < band.hi; ++j) acc += pv[j] * v(b, hk, j, e);
      out(b, h, i, e) = masked ? 0.0 : acc / sum;
      nonfinite |= !std::isfinite(out(b, h, i, e));
    }
    emptied = emptied || (masked && mask.row_has_allowed_key(b, h, i));
    if (!lse.empty()) lse(b, h, i) = masked ? kNegInf : row_max + std::log(sum);
    if (!weights.empty()) {
      for (int64_t j = 0; j < s.M; ++j) {
        const bool in_band = !masked && j >= band.lo && j < band.hi;
        weights(b, h, i, j) = in_band ? row[j] / sum : 0.0;
      }
    }
  });
  if (nonfinite || emptied)
    detail::refuse_overflow({"reference_attention_forward", "float64", "1.8e308", "scale the inputs down"}, q, k, v,
                            options.mask);
}

}  // namespace qkv
