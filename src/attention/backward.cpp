// attention_backward: argument checks, the float64 oracle (Kernel::reference), the fused
// kernel's params (its driver is kernels/backward.cpp), and the diagnosis of a non-finite
// gradient. Masks go through MaskEval, exactly as in the forward.
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include <fmt/format.h>

#include "attention/backward_checks.h"
#include "attention/backward_rows.h"
#include "attention/overflow.h"
#include "kernels/backward.h"
#include "kernels/dispatch.h"
#include "kernels/mask_eval.h"
#include "qkv/backward.h"
#include "qkv/interrupt.h"
#include "qkv/reference.h"

namespace qkv {
namespace detail {

std::string BackwardRows::lse_row(int64_t b, int64_t h, int64_t i) const {
  if (packed) return fmt::format("lse[{}, {}] (head, packed query row)", h, row0 + i);
  return fmt::format("lse[{}, {}, {}] (batch, head, query row)", b, h, row0 + i);
}

}  // namespace detail

namespace {

detail::Overflow fp32_backward_overflow(const detail::BackwardRows& rows) {
  return detail::fp32_overflow("attention_backward", rows.caller);
}

// The backward gives a row whose lse is -inf zero gradients, so that the forward's -inf
// round-trips; NaN or +inf is refused by the rule for a caller's lse (impossible_lse).
template <class L>
void refuse_impossible_lse(TensorView<const L> lse, TensorView<const float> q, TensorView<const float> k,
                           TensorView<const float> v, const Mask& mask, const detail::BackwardRows& rows) {
  const std::optional<NonFinite> bad = find_non_finite(lse, true);
  if (!bad || detail::inputs_explain_overflow(q, k, v, mask)) return;
  const std::vector<int64_t>& at = bad->index;
  detail::refuse_impossible_lse(fp32_backward_overflow(rows).who, rows.lse_row(at[0], at[1], at[2]), bad->value,
                                "q, k and v", "pass the lse that the forward returned with out");
}

// Called when the gradients of finite inputs overflowed: refuses naming lse if a row's given lse
// is not the one the forward computes from these inputs (same_row_lse), since one below the row's
// own takes its weights past 1 and blaming q, k, v and dout then misleads. With a part of the keys
// (partial) the given whole row's lse is at least the part's own, so only one below it is foreign.
// Costs a forward, on the error path only.
template <class L>
void refuse_foreign_lse(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                        TensorView<const L> lse, const AttentionOptions& options, const detail::BackwardRows& rows) {
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2);
  Tensor<float> out({B, H, N, v.dim(3)}, "out");
  Tensor<double> own({B, H, N}, "lse");
  try {
    attention_forward_lse64(out.view(), own.view(), q, k, v, options);
  } catch (const Interrupted&) {
    throw;
  } catch (const Error&) {
    return;  // the forward overflows too: the inputs themselves are past the range
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        const double o = own.view()(b, h, i), g = lse(b, h, i);
        if (o == -std::numeric_limits<double>::infinity()) continue;  // no allowed key: reads no weight
        if (kernels::same_row_lse(o, g, std::is_same_v<L, double>) || (rows.partial && g > o)) continue;
        throw Error(
            fmt::format("{}: the gradients overflowed float32 because {} = {:.6g} is not the forward's for "
                        "these q, k and v ({} {:.6g}): pass the lse that the forward returned with out",
                        fp32_backward_overflow(rows).who, rows.lse_row(b, h, i), g,
                        rows.partial ? "the log-sum-exp of this part of its keys is" : "that row's is", o));
      }
}

// Kernel::reference: the float64 oracle on widened inputs, each gradient rounded once.
void reference_backward_f32(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                            TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                            TensorView<const float> v, const AttentionOptions& options,
                            const detail::BackwardRows& rows) {
  const Tensor<double> q64 = to_contiguous<double>(q), k64 = to_contiguous<double>(k), v64 = to_contiguous<double>(v),
                       dout64 = to_contiguous<double>(dout);
  Tensor<double> dq64(dq.shape(), "dq"), dk64(dk.shape(), "dk"), dv64(dv.shape(), "dv"), dbias64;
  if (!dbias.empty()) dbias64 = Tensor<double>(dbias.shape(), "dbias");
  reference_attention_backward(dq64.view(), dk64.view(), dv64.view(),
                               dbias.empty() ? TensorView<double>() : dbias64.view(), dout64.cview(), q64.cview(),
                               k64.cview(), v64.cview(), options);
  const std::pair<TensorView<float>, const Tensor<double>*> outputs[] = {
      {dq, &dq64}, {dk, &dk64}, {dv, &dv64}, {dbias, &dbias64}};
  bool finite = true;
  for (const auto& [to, from] : outputs) {
    if (to.empty()) continue;
    const double* x = from->data();
    for_each_element(to, [&](float& y, const auto&) {
      y = static_cast<float>(*x++);
      finite = finite && std::isfinite(y);
    });
  }
  // A gradient past float32's range, rounded to inf, is refused as the fused kernel refuses it.
  if (!finite) detail::refuse_overflow(fp32_backward_overflow(rows), q, k, v, options.mask, &dout);
}

// lse of L: float, or double (the forward's lse without its rounding to fp32).
template <class L>
void backward_any(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                  TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                  TensorView<const float> v, TensorView<const float> out, TensorView<const L> lse,
                  const AttentionOptions& options, detail::BackwardRows rows = {}) {
  const AttentionShape s = check_attention_shapes(q.shape(), k.shape(), v.shape(), options);
  detail::check_backward_outputs(s, dq.shape(), dk.shape(), dv.shape(), dbias, dout.shape());
  require_shape(out.shape(), std::array<int64_t, 4>{s.B, s.H, s.N, s.Dv}, "out");
  require_shape(lse.shape(), std::array<int64_t, 3>{s.B, s.H, s.N}, "lse");
  std::vector<detail::NamedSpan> read = detail::read_spans(q, k, v, options.mask);
  read.insert(read.end(),
              {detail::named_span("dout", dout), detail::named_span("out", out), detail::named_span("lse", lse)});
  detail::require_gradient_outputs(dq, dk, dv, dbias, std::move(read));
  refuse_impossible_lse(lse, q, k, v, options.mask, rows);
  if (options.kernel == Kernel::reference) {
    reference_backward_f32(dq, dk, dv, dbias, dout, q, k, v, options, rows);
    return;
  }
  const Simd path = kernels::resolve_simd(options.simd);
  const detail::MaskEval mask(options.mask, s);
  kernels::BackwardParams p(kernels::forward_params(q, k, v, s, options, mask));
  // The forward's out and lse are inputs here: the backward only reads them.
  p.out = const_cast<float*>(out.data()), p.out_stride = kernels::strides_of(out);
  if constexpr (std::is_same_v<L, double>)
    p.lse_wide = const_cast<double*>(lse.data());
  else
    p.lse = const_cast<float*>(lse.data());
  p.lse_stride = kernels::strides_of(lse);
  p.dout = dout.data(), p.dout_stride = kernels::strides_of(dout);
  p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  p.dq_stride = kernels::strides_of(dq), p.dk_stride = kernels::strides_of(dk), p.dv_stride = kernels::strides_of(dv);
  p.dbias = dbias.empty() ? nullptr : dbias.data(), p.dbias_stride = kernels::strides_of(dbias);
  p.whole_rows = !rows.partial;
  if (kernels::backward(p, dk, dv, dbias, path, options.num_threads)) return;
  // The kernel flags an inf or NaN gradient as it writes it. Non-finite inputs or out explain it
  // (lse's NaN and +inf were refused above unless the inputs explain them); otherwise a foreign
  // lse or an fp32 overflow (dout·v or a sum past the range) does.
  detail::refuse_overflow(fp32_backward_overflow(rows), q, k, v, options.mask, &dout, !detail::all_finite(out),
                          [&] { refuse_foreign_lse(q, k, v, lse, options, rows); });
}

}  // namespace

void attention_backward(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                        TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                        const AttentionOptions& options) {
  backward_any(dq, dk, dv, dbias, dout, q, k, v, out, lse, options);
}

void attention_backward(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                        TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> out, TensorView<const double> lse,
                        const AttentionOptions& options) {
  backward_any(dq, dk, dv, dbias, dout, q, k, v, out, lse, options);
}

namespace detail {

void attention_backward_rows(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                             TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                             TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                             const AttentionOptions& options, BackwardRows rows) {
  backward_any(dq, dk, dv, dbias, dout, q, k, v, out, lse, options, rows);
}

void attention_backward_rows(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                             TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                             TensorView<const float> v, TensorView<const float> out, TensorView<const double> lse,
                             const AttentionOptions& options, BackwardRows rows) {
  backward_any(dq, dk, dv, dbias, dout, q, k, v, out, lse, options, rows);
}

}  // namespace detail
}  // namespace qkv
