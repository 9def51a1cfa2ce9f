// decode_attention: input checks, the kernel's params from the paged cache (its driver, which
// plans, launches and merges, is kernels/decode.cpp), and the diagnosis of a non-finite result.
#include "qkv/decode.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "cache/decode_reads.h"
#include "kernels/decode.h"
#include "kernels/dispatch.h"

namespace qkv {
namespace {

using kernels::DecodeParams;

void check_paged(const PagedKV& kv) {
  require_kv_dtype(kv.dtype, "decode_attention");
  if (kv.Hkv <= 0 || kv.D <= 0 || kv.Dv <= 0 || kv.page_tokens <= 0 || kv.num_pages <= 0)
    throw Error(
        fmt::format("decode_attention: the cache's Hkv, D, Dv, page_tokens and num_pages must be positive, "
                    "got {}, {}, {}, {}, {}",
                    kv.Hkv, kv.D, kv.Dv, kv.page_tokens, kv.num_pages));
  if (kv.k == nullptr || kv.v == nullptr ||
      (kv.dtype == KVDtype::i8 && (kv.k_scale == nullptr || kv.v_scale == nullptr)))
    throw Error("decode_attention: the cache's pools (and i8 scales) must be set");
  // Every product the kernel forms from these sizes (pool offsets in bytes, block table entries,
  // token counts) stays within the pool or the table refused here, so none can wrap.
  const int64_t bytes = kv_dtype_bytes(kv.dtype);
  const std::array<int64_t, 4> kshape{kv.num_pages, kv.Hkv, kv.page_tokens, kv.D};
  const std::array<int64_t, 4> vshape{kv.num_pages, kv.Hkv, kv.page_tokens, kv.Dv};
  checked_numel(kshape, static_cast<std::size_t>(bytes), "decode_attention: the cache's key pool");
  checked_numel(vshape, static_cast<std::size_t>(bytes), "decode_attention: the cache's value pool");
  if (kv_dtype_scaled(kv.dtype))
    checked_numel(std::span(kshape).first(3), sizeof(float), "decode_attention: the cache's scales");
  const int64_t B = kv.batch();
  const std::array<int64_t, 2> table{B, kv.max_blocks};
  if (kv.max_blocks < 0 || static_cast<int64_t>(kv.block_table.size()) !=
                               checked_numel(table, sizeof(int32_t), "decode_attention: block_table"))
    throw Error(fmt::format("decode_attention: block_table has {} entries, expected B · max_blocks = {} · {}",
                            kv.block_table.size(), B, kv.max_blocks));
  const std::array<int64_t, 2> tokens{kv.max_blocks, kv.page_tokens};
  const int64_t capacity = checked_numel(tokens, 1, "decode_attention: max_blocks · page_tokens");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = kv.seq_lens[b];
    if (len < 0 || len > capacity)
      throw Error(fmt::format("decode_attention: seq_lens[{}] = {} is outside [0, max_blocks · page_tokens = {}]", b,
                              len, capacity));
    for (int64_t e = 0; e < (len + kv.page_tokens - 1) / kv.page_tokens; ++e) {
      const int32_t page = kv.block_table[b * kv.max_blocks + e];
      if (page < 0 || page >= kv.num_pages)
        throw Error(fmt::format("decode_attention: block_table[{}, {}] = {} points outside the pool of {} pages", b, e,
                                page, kv.num_pages));
    }
  }
}

// Checks q, out, lse and the options against the cache; returns the attention shape with M the
// longest sequence.
AttentionShape check_decode(TensorView<float> out, TensorView<float> lse, TensorView<const float> q, const PagedKV& kv,
                            const DecodeOptions& o) {
  check_paged(kv);
  if (q.rank() != 4)
    throw Error(fmt::format("decode_attention: q must be [B, H, N, D], got {}", shape_string(q.shape())));
  checked_numel(q.shape(), sizeof(float), "decode_attention: q");
  if (q.dim(0) != kv.batch())
    throw Error(fmt::format("decode_attention: q has B = {} but {} sequences were given", q.dim(0), kv.batch()));
  if (q.dim(3) != kv.D)
    throw Error(fmt::format("decode_attention: mismatched head dims: q has D = {}, the cache D = {}", q.dim(3), kv.D));
  const AttentionOptions& ao = o.attention;
  if (!ao.mask.key_lengths.empty())
    throw Error("decode_attention: mask.key_lengths must be empty (the sequence lengths are the key lengths)");
  if (ao.kernel == Kernel::reference)
    throw Error(
        "decode_attention: there is no reference kernel for decode (decode_attention_weights is the float64 one)");
  if (ao.dropout.active()) throw Error("decode_attention: dropout is not supported (decode is inference)");
  require_scale(ao.scale, "decode_attention");
  const int64_t M = kv.seq_lens.empty() ? 0 : *std::max_element(kv.seq_lens.begin(), kv.seq_lens.end());
  const std::array<int64_t, 4> ks{q.dim(0), kv.Hkv, M, kv.D}, vs{q.dim(0), kv.Hkv, M, kv.Dv};
  const AttentionShape s = check_attention_shapes(q.shape(), ks, vs, ao);
  const std::array<int64_t, 4> want_out{s.B, s.H, s.N, s.Dv};
  if (!std::ranges::equal(out.shape(), want_out))
    throw Error(fmt::format("decode_attention: out has shape {}, expected {}", shape_string(out.shape()),
                            shape_string(want_out)));
  const std::array<int64_t, 3> want_lse{s.B, s.H, s.N};
  if (!lse.empty() && !std::ranges::equal(lse.shape(), want_lse))
    throw Error(fmt::format("decode_attention: lse has shape {}, expected {}", shape_string(lse.shape()),
                            shape_string(want_lse)));
  if (!o.sinks.empty() && static_cast<int64_t>(o.sinks.size()) != s.H)
    throw Error(fmt::format("decode_attention: sinks has {} entries, expected one per query head (H = {})",
                            o.sinks.size(), s.H));
  for (std::size_t h = 0; h < o.sinks.size(); ++h)  // -inf: no sink for that head
    if (std::isnan(o.sinks[h]) || o.sinks[h] == std::numeric_limits<float>::infinity())
      throw Error(
          fmt::format("decode_attention: sinks[{}] = {} must be a finite logit or -inf (no sink)", h, o.sinks[h]));
  if (o.sink_tokens < 0) throw Error(fmt::format("decode_attention: sink_tokens = {} is negative", o.sink_tokens));
  // The kernel writes rows of out and lse while it still reads q, the mask and the pools.
  std::vector<detail::NamedSpan> read = detail::decode_read_spans(q, kv, ao.mask);
  detail::require_output(out, "decode_attention: out", read);
  read.push_back({"out", byte_span(out)});
  if (!lse.empty()) detail::require_output(lse, "decode_attention: lse", read);
  return s;
}

// Names the cause of a non-finite decode result: a value of q, a NaN or +inf in the bias, else an
// fp32 overflow.
void refuse_nonfinite_result(TensorView<const float> q, const Mask& mask) {
  if (const auto bad = find_non_finite(q))
    throw Error(fmt::format("decode_attention: q{} = {} must be finite", shape_string(bad->index), bad->value));
  if (const auto bad = mask.bias.empty() ? std::nullopt : find_non_finite(mask.bias, true))
    throw Error(fmt::format("decode_attention: bias{} = {} must be a number below +inf (-inf masks)",
                            shape_string(bad->index), bad->value));
  throw Error(
      "decode_attention: the output overflowed float32 although q and the cache are finite (scores or P·V sums "
      "beyond 3.4e38); scale q or the cached values down");
}

// The kernel's params: the cache's pools and block table, q, the scale and the mask.
DecodeParams decode_params(TensorView<const float> q, const PagedKV& kv, const AttentionShape& s, double scale,
                           const detail::MaskEval& mask, int64_t sink_tokens) {
  DecodeParams p;
  p.B = s.B, p.H = s.H, p.Hkv = s.Hkv, p.N = s.N, p.D = s.D, p.Dv = s.Dv, p.G = s.H / s.Hkv;
  p.dtype = kv.dtype;
  p.k = static_cast<const char*>(kv.k);
  p.v = static_cast<const char*>(kv.v);
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  p.page_tokens = kv.page_tokens;
  p.max_blocks = kv.max_blocks;
  p.block_table = kv.block_table.data();
  p.q = q.data();
  p.q_stride = kernels::strides_of(q);
  p.scale = static_cast<float>(scale);
  p.mask = &mask;
  p.sink_tokens = sink_tokens;
  return p;
}

}  // namespace

void decode_attention(TensorView<float> out, TensorView<float> lse, TensorView<const float> q, const PagedKV& kv,
                      const DecodeOptions& options) {
  const AttentionShape s = check_decode(out, lse, q, kv, options);
  const AttentionOptions& ao = options.attention;
  const Simd path = kernels::resolve_simd(ao.simd);
  Mask mask = ao.mask;
  mask.key_lengths = kv.seq_lens;
  const detail::MaskEval eval(mask, s);
  const DecodeParams p = decode_params(q, kv, s, attention_scale(ao.scale, s.D), eval, options.sink_tokens);
  const float* sinks = options.sinks.empty() ? nullptr : options.sinks.data();
  if (!kernels::decode(p, kv.seq_lens.data(), sinks, out, lse, path, ao.num_threads)) refuse_nonfinite_result(q, mask);
}

}  // namespace qkv
