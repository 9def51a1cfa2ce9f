// Packed variable-length attention: each sequence is one call of the padded kernels on views into
// the packed tensors (no copy, no padding), so every option and every exactness rule of those
// kernels holds per sequence unchanged.
#include "qkv/varlen.h"

#include <algorithm>
#include <array>
#include <limits>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "attention/backward_checks.h"
#include "attention/backward_rows.h"
#include "attention/forward_as.h"
#include "attention/output_checks.h"
#include "qkv/backward.h"
#include "qkv/error.h"

namespace qkv {
namespace {

// Rows [r0, r1) of a packed [total, X, E] tensor as the [1, X, r1 - r0, E] view a kernel takes.
template <class T>
TensorView<T> rows_of(TensorView<T> t, int64_t r0, int64_t r1) {
  const std::array<int64_t, 4> shape{1, t.dim(1), r1 - r0, t.dim(2)};
  const std::array<int64_t, 4> strides{t.stride(0) * std::max<int64_t>(r1 - r0, 1), t.stride(1), t.stride(0),
                                       t.stride(2)};
  return TensorView<T>(t.data() + r0 * t.stride(0), shape, strides);
}

// Columns [c0, c1) of lse [H, total] as the [1, H, c1 - c0] view a kernel takes.
template <class T>
TensorView<T> lse_of(TensorView<T> lse, int64_t c0, int64_t c1) {
  const std::array<int64_t, 3> shape{1, lse.dim(0), c1 - c0};
  const std::array<int64_t, 3> strides{lse.stride(0) * lse.dim(0), lse.stride(0), lse.stride(1)};
  return TensorView<T>(lse.data() + c0 * lse.stride(1), shape, strides);
}

void require_shape(std::span<const int64_t> got, std::initializer_list<int64_t> want, const char* name) {
  if (!std::equal(got.begin(), got.end(), want.begin(), want.end()))
    throw Error(fmt::format("varlen: {} must be {}, got {}", name,
                            shape_string(std::span<const int64_t>(want.begin(), want.size())), shape_string(got)));
}

struct Packed {
  int64_t total_q, total_k, H, Hkv, D, Dv, sequences;
};

Packed check_packed(std::span<const int64_t> q, std::span<const int64_t> k, std::span<const int64_t> v,
                    std::span<const int64_t> cu_q, std::span<const int64_t> cu_k, const AttentionOptions& options) {
  for (auto [shape, name] :
       {std::pair{q, "q [total_q, H, D]"}, std::pair{k, "k [total_k, Hkv, D]"}, std::pair{v, "v [total_k, Hkv, Dv]"}})
    if (shape.size() != 3)
      throw Error(fmt::format("varlen: {} must have rank 3, got shape {}", name, shape_string(shape)));
  const Packed p{q[0], k[0], q[1], k[1], q[2], v[2], static_cast<int64_t>(cu_q.size()) - 1};
  if (k[2] != p.D) throw Error(fmt::format("varlen: head dims differ: q has D = {} but k has D = {}", p.D, k[2]));
  if (v[0] != p.total_k || v[1] != p.Hkv)
    throw Error(fmt::format("varlen: k {} and v {} must agree on [total_k, Hkv]", shape_string(k), shape_string(v)));
  if (cu_q.size() != cu_k.size())
    throw Error(fmt::format("varlen: cu_seqlens_q has {} entries but cu_seqlens_k has {}: one per sequence plus one",
                            cu_q.size(), cu_k.size()));
  check_cu_seqlens(cu_q, p.total_q, "cu_seqlens_q");
  check_cu_seqlens(cu_k, p.total_k, "cu_seqlens_k");
  const Mask& m = options.mask;
  if (!m.key_lengths.empty() || !m.query_lengths.empty() || !m.keep.empty() || !m.bias.empty() ||
      !m.diagonal_offsets.empty())
    throw Error(
        "varlen: key_lengths, query_lengths, keep and bias masks are not supported (each sequence has its "
        "own lengths; mask a sequence's keys by leaving them out of it)");
  // Heads, head dims and options once for all sequences, since a sequence without keys makes no
  // call that would check them.
  check_attention_shapes(std::array<int64_t, 4>{1, p.H, 1, p.D}, std::array<int64_t, 4>{1, p.Hkv, 1, p.D},
                         std::array<int64_t, 4>{1, p.Hkv, 1, p.Dv}, options);
  return p;
}

}  // namespace

void check_cu_seqlens(std::span<const int64_t> cu, int64_t total, const char* name) {
  if (cu.empty()) throw Error(fmt::format("varlen: {} must have at least one entry (0)", name));
  if (cu.front() != 0) throw Error(fmt::format("varlen: {}[0] must be 0, got {}", name, cu.front()));
  for (std::size_t s = 1; s < cu.size(); ++s)
    if (cu[s] < cu[s - 1])
      throw Error(
          fmt::format("varlen: {} must not decrease, but [{}] = {} < [{}] = {}", name, s, cu[s], s - 1, cu[s - 1]));
  if (cu.back() != total)
    throw Error(fmt::format("varlen: {} must end at the {} packed rows, got {}", name, total, cu.back()));
}

void varlen_attention_forward(TensorView<float> out, TensorView<double> lse, TensorView<const float> q,
                              TensorView<const float> k, TensorView<const float> v, std::span<const int64_t> cu_q,
                              std::span<const int64_t> cu_k, const AttentionOptions& options) {
  const Packed p = check_packed(q.shape(), k.shape(), v.shape(), cu_q, cu_k, options);
  require_shape(out.shape(), {p.total_q, p.H, p.Dv}, "out");
  if (!lse.empty()) require_shape(lse.shape(), {p.H, p.total_q}, "lse");
  // Whole tensors, before any sequence is written: one sequence's rows may overlap another's inputs.
  std::vector<detail::NamedSpan> read = detail::read_spans(q, k, v, options.mask);
  detail::add_output(read, out, "varlen: out");
  detail::require_output(lse, "varlen: lse", read);
  AttentionOptions o = options;
  for (int64_t s = 0; s < p.sequences; ++s) {
    const int64_t q0 = cu_q[s], q1 = cu_q[s + 1], k0 = cu_k[s], k1 = cu_k[s + 1];
    if (q1 == q0) continue;
    if (k1 == k0) {  // queries with no key at all: fully masked rows
      for (int64_t i = q0; i < q1; ++i)
        for (int64_t h = 0; h < p.H; ++h) {
          for (int64_t e = 0; e < p.Dv; ++e) out(i, h, e) = 0.0f;
          if (!lse.empty()) lse(h, i) = -std::numeric_limits<double>::infinity();
        }
      continue;
    }
    o.dropout.first_batch = options.dropout.first_batch + s;
    detail::attention_forward_as({"varlen_attention_forward", detail::kVarlenOverflowRemedy}, rows_of(out, q0, q1),
                                 lse.empty() ? TensorView<double>{} : lse_of(lse, q0, q1), rows_of(q, q0, q1),
                                 rows_of(k, k0, k1), rows_of(v, k0, k1), o);
  }
}

void varlen_attention_backward(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv,
                               TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                               TensorView<const float> v, TensorView<const float> out, TensorView<const double> lse,
                               std::span<const int64_t> cu_q, std::span<const int64_t> cu_k,
                               const AttentionOptions& options) {
  const Packed p = check_packed(q.shape(), k.shape(), v.shape(), cu_q, cu_k, options);
  require_shape(dq.shape(), {p.total_q, p.H, p.D}, "dq");
  require_shape(dk.shape(), {p.total_k, p.Hkv, p.D}, "dk");
  require_shape(dv.shape(), {p.total_k, p.Hkv, p.Dv}, "dv");
  require_shape(dout.shape(), {p.total_q, p.H, p.Dv}, "dout");
  require_shape(out.shape(), {p.total_q, p.H, p.Dv}, "out");
  require_shape(lse.shape(), {p.H, p.total_q}, "lse");
  std::vector<detail::NamedSpan> read = detail::read_spans(q, k, v, options.mask);
  read.insert(read.end(),
              {detail::named_span("dout", dout), detail::named_span("out", out), detail::named_span("lse", lse)});
  detail::require_gradient_outputs(dq, dk, dv, TensorView<float>(), std::move(read));
  AttentionOptions o = options;
  for (int64_t s = 0; s < p.sequences; ++s) {
    const int64_t q0 = cu_q[s], q1 = cu_q[s + 1], k0 = cu_k[s], k1 = cu_k[s + 1];
    if (q1 == q0 || k1 == k0) {  // no pair of the sequence attends: every gradient of its rows is 0
      for (auto [t, r0, r1] : {std::tuple{dq, q0, q1}, std::tuple{dk, k0, k1}, std::tuple{dv, k0, k1}})
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t x = 0; x < t.dim(1); ++x)
            for (int64_t e = 0; e < t.dim(2); ++e) t(r, x, e) = 0.0f;
      continue;
    }
    o.dropout.first_batch = options.dropout.first_batch + s;
    // Messages name varlen, its packed lse rows, and no kernel choice (Python's varlen has none).
    detail::attention_backward_rows(
        rows_of(dq, q0, q1), rows_of(dk, k0, k1), rows_of(dv, k0, k1), {}, rows_of(dout, q0, q1), rows_of(q, q0, q1),
        rows_of(k, k0, k1), rows_of(v, k0, k1), rows_of(out, q0, q1), lse_of(lse, q0, q1), o,
        {.caller = {"varlen_attention_backward", detail::kVarlenOverflowRemedy}, .row0 = q0, .packed = true});
  }
}

}  // namespace qkv
