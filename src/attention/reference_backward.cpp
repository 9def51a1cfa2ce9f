// The float64 oracle of attention_backward: one query row at a time, everything recomputed from
// q, k, v with the same MaskEval as the forward.
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "attention/backward_checks.h"
#include "attention/overflow.h"
#include "attention/row_logits.h"
#include "qkv/backward.h"
#include "qkv/reference.h"
#include "qkv/interrupt.h"

namespace qkv {

// q: [B, H, N, D], k: [B, Hkv, M, D], v: [B, Hkv, M, Dv], dout: [B, H, N, Dv]
// -> dq: [B, H, N, D], dk: [B, Hkv, M, D], dv: [B, Hkv, M, Dv], dbias: [B, H, N, M].
void reference_attention_backward(TensorView<double> dq, TensorView<double> dk, TensorView<double> dv,
                                  TensorView<double> dbias, TensorView<const double> dout, TensorView<const double> q,
                                  TensorView<const double> k, TensorView<const double> v,
                                  const AttentionOptions& options) {
  const AttentionShape s = check_attention_shapes(q.shape(), k.shape(), v.shape(), options);
  detail::check_backward_outputs(s, dq.shape(), dk.shape(), dv.shape(), dbias, dout.shape());
  std::vector<detail::NamedSpan> read = detail::read_spans(q, k, v, options.mask);
  read.push_back(detail::named_span("dout", dout));
  detail::require_gradient_outputs(dq, dk, dv, dbias, std::move(read));
  const double scale = attention_scale(options.scale, s.D);
  const double cap = options.mask.softcap;
  const detail::MaskEval mask(options.mask, s);
  const double drop_scale = dropout_scale(options.dropout);

  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.Hkv; ++h)
      for (int64_t j = 0; j < s.M; ++j) {
        for (int64_t d = 0; d < s.D; ++d) dk(b, h, j, d) = 0.0;
        for (int64_t e = 0; e < s.Dv; ++e) dv(b, h, j, e) = 0.0;
      }
  }
  // Per row: raw scaled scores x_j, logits l_j, probabilities p_j, and dL/dl_j.
  std::vector<double> x(static_cast<std::size_t>(s.M)), p(x.size()), dl(x.size());
  bool emptied = false;  // a row with allowed keys whose every logit is -inf (overflow.h)
  detail::for_each_query_row(s, [&](int64_t b, int64_t h, int64_t hk, int64_t i) {
    const detail::RowLogits r = detail::row_logits(p.data(), x.data(), mask, q, k, scale, b, h, hk, i);
    const detail::KeyBand band = r.band;
    const bool masked = r.masked;
    emptied = emptied || (masked && mask.row_has_allowed_key(b, h, i));
    const double sum = masked ? 0.0 : detail::exp_in_place(p.data(), r);
    // D_i = sum_j p_j dP_j with dP_j = dout_i · v_j; then dL/dl_j = p_j (dP_j - D_i). With dropout
    // dP_j is z_j·dout_i·v_j / (1 − p) (z_j the keep-mask) and v_j's weight p_j·z_j / (1 − p).
    const DropoutRow drop(options.dropout, s.H, b, h, i);
    auto kept = [&](int64_t j) { return options.dropout.active() ? (drop.keep(j) ? drop_scale : 0.0) : 1.0; };
    double row_dot = 0.0;
    for (int64_t j = band.lo; j < band.hi && !masked; ++j) {
      p[j] /= sum;
      double dp = 0.0;
      for (int64_t e = 0; e < s.Dv; ++e) dp += dout(b, h, i, e) * v(b, hk, j, e);
      dl[j] = dp * kept(j);
      row_dot += p[j] * dl[j];
    }
    for (int64_t d = 0; d < s.D; ++d) dq(b, h, i, d) = 0.0;
    if (!dbias.empty())
      for (int64_t j = 0; j < s.M; ++j) dbias(b, h, i, j) = 0.0;
    if (masked) return;
    for (int64_t j = band.lo; j < band.hi; ++j) {
      dl[j] = p[j] * (dl[j] - row_dot);
      if (!dbias.empty()) dbias(b, h, i, j) = dl[j];
      double ds = dl[j];  // dL/dx_j: through softcap's tanh when it is on
      if (cap > 0) {
        const double t = std::tanh(x[j] / cap);
        ds *= 1.0 - t * t;
      }
      for (int64_t d = 0; d < s.D; ++d) {
        dq(b, h, i, d) += scale * ds * k(b, hk, j, d);
        dk(b, hk, j, d) += scale * ds * q(b, h, i, d);
      }
      const double weight = p[j] * kept(j);
      for (int64_t e = 0; e < s.Dv; ++e) dv(b, hk, j, e) += weight * dout(b, h, i, e);
    }
  });
  // As the forward refuses what overflows its output: scores past the range (q·1e155 against
  // k·1e155) made every gradient NaN, and dout·v or a gradient's sum past it made them inf or NaN,
  // all returned as if they were gradients.
  bool finite = true;
  for (const TensorView<double>* g : {&dq, &dk, &dv, &dbias})
    if (!g->empty()) finite = finite && detail::all_finite(TensorView<const double>(*g));
  if (!finite || emptied)
    detail::refuse_overflow({"reference_attention_backward", "float64", "1.8e308", "scale the inputs down"}, q, k, v,
                            options.mask, &dout);
}

}  // namespace qkv
