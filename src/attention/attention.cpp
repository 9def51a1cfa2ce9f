#include "qkv/attention.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "kernels/dispatch.h"
#include "kernels/forward.h"
#include "attention/forward_as.h"
#include "attention/output_checks.h"
#include "attention/overflow.h"
#include "kernels/mask_eval.h"
#include "qkv/interrupt.h"
#include "qkv/options_parse.h"
#include "qkv/reference.h"

namespace qkv {
namespace {

void require_rank4(std::span<const int64_t> shape, const char* name, const char* letters) {
  if (shape.size() != 4)
    throw Error(fmt::format("{}: expected rank 4 {}, got shape {}", name, letters, shape_string(shape)));
  checked_numel(shape, sizeof(float), name);  // a negative size, or one past what memory can address
}

}  // namespace

AttentionShape check_attention_shapes(std::span<const int64_t> q, std::span<const int64_t> k,
                                      std::span<const int64_t> v, const AttentionOptions& options) {
  require_rank4(q, "q", "[B, H, N, D]");
  require_rank4(k, "k", "[B, Hkv, M, D]");
  require_rank4(v, "v", "[B, Hkv, M, Dv]");
  AttentionShape s{q[0], q[1], k[1], q[2], k[2], q[3], v[3]};
  if (k[0] != s.B || v[0] != s.B)
    throw Error(fmt::format("batch sizes differ: q {}, k {}, v {}", shape_string(q), shape_string(k), shape_string(v)));
  if (k[3] != s.D) throw Error(fmt::format("head dims differ: q has D = {} but k has D = {}", s.D, k[3]));
  if (v[1] != s.Hkv || v[2] != s.M)
    throw Error(fmt::format("k {} and v {} must agree on [B, Hkv, M]", shape_string(k), shape_string(v)));
  if (s.D <= 0) throw Error(fmt::format("head dim D must be at least 1, got {}", s.D));
  if (s.Dv <= 0) throw Error(fmt::format("value head dim Dv must be at least 1, got {}", s.Dv));
  if (s.D > kMaxHeadDim || s.Dv > kMaxHeadDim)
    throw Error(fmt::format("head dims D = {} and Dv = {} must be at most {} (kMaxHeadDim)", s.D, s.Dv, kMaxHeadDim));
  require_head_groups(s.H, s.Hkv, "attention");
  require_scale(options.scale, "attention");
  check_dropout(options.dropout, "attention");
  // Enums set from integers (a C caller, a cast): a value outside them would run as some other.
  if (options.kernel != Kernel::automatic && options.kernel != Kernel::reference && options.kernel != Kernel::fused)
    throw Error(
        fmt::format("kernel = {} is not a Kernel (automatic, reference or fused)", static_cast<int>(options.kernel)));

  const Mask& m = options.mask;
  for (const auto& [align, name] :
       {std::pair{m.causal.value_or(CausalAlign::top_left), "causal"}, std::pair{m.diagonal, "diagonal"}})
    if (align != CausalAlign::top_left && align != CausalAlign::bottom_right)
      throw Error(
          fmt::format("mask.{} = {} is not a CausalAlign (top_left or bottom_right)", name, static_cast<int>(align)));
  if (!m.key_lengths.empty()) check_lengths(m.key_lengths, s.B, s.M, "key_lengths");
  if (!m.query_lengths.empty()) check_lengths(m.query_lengths, s.B, s.N, "query_lengths");
  if (!m.diagonal_offsets.empty() && static_cast<int64_t>(m.diagonal_offsets.size()) != s.B)
    throw Error(fmt::format("diagonal_offsets: expected {} entries (one per batch row), got {}", s.B,
                            m.diagonal_offsets.size()));
  for (std::size_t b = 0; b < m.diagonal_offsets.size(); ++b)
    if (m.diagonal_offsets[b] > kMaxDiagonalOffset || m.diagonal_offsets[b] < -kMaxDiagonalOffset)
      throw Error(fmt::format("diagonal_offsets[{}] = {} is outside ±2^60", b, m.diagonal_offsets[b]));
  auto check_mask_view = [&](std::span<const int64_t> shape, const char* name) {
    const std::array<int64_t, 4> want{s.B, s.H, s.N, s.M};
    if (shape.size() != 4 || !std::equal(shape.begin(), shape.end(), want.begin()))
      throw Error(fmt::format("{}: shape {} must be [B, H, N, M] = {} (use broadcast_mask)", name, shape_string(shape),
                              shape_string(want)));
  };
  if (!m.keep.empty()) check_mask_view(m.keep.shape(), "keep mask");
  if (!m.bias.empty()) check_mask_view(m.bias.shape(), "bias");
  if (!m.alibi_slopes.empty()) check_alibi_count(m.alibi_slopes.size(), s.H);
  for (std::size_t h = 0; h < m.alibi_slopes.size(); ++h) alibi_slope_value(m.alibi_slopes[h], h);
  softcap_value(m.softcap);
  return s;
}

float lse_to_float32(double lse) {
  const float x = static_cast<float>(lse);
  if (std::isinf(x) && std::isfinite(lse))
    throw Error(fmt::format(
        "attention_forward: lse = {:.3g} is finite but past float32's range (3.4e38); ask for it in float64 "
        "(attention_forward_lse64; return_lse=\"float64\" in Python) or scale the inputs down",
        lse));
  return x;
}

namespace {

// A contiguous float64 copy of x (float32 or bf16, widened exactly), made a row at a time with a stop
// check before each row: at N = 6000 the three copies took 0.2-1.5 s on a loaded machine, and
// Ctrl-C waited for them.
template <class T>
Tensor<double> widen_interruptible(TensorView<const T> x, const char* name) {
  InterruptScope* const interrupt = InterruptScope::current();
  Tensor<double> wide(x.shape(), name);
  const TensorView<const T> x4 = x.as_rank4();
  const int64_t cols = x4.dim(3), step = x4.stride(3);
  double* to = wide.data();
  for (int64_t a = 0; a < x4.dim(0); ++a)
    for (int64_t b = 0; b < x4.dim(1); ++b)
      for (int64_t r = 0; r < x4.dim(2) && cols > 0; ++r) {
        if (stop_requested(interrupt)) throw Interrupted();
        const T* from = &x4(a, b, r, 0);
        for (int64_t c = 0; c < cols; ++c) *to++ = element_cast<double>(from[c * step]);
      }
  return wide;
}

// The float64 reference on float32 or bf16 inputs, rounded to float32 (lse to L).
template <class T, class L>
void reference_forward_narrow(TensorView<float> out, TensorView<L> lse, TensorView<const T> q, TensorView<const T> k,
                              TensorView<const T> v, const AttentionOptions& options) {
  Tensor<double> q64 = widen_interruptible(q, "q"), k64 = widen_interruptible(k, "k"),
                 v64 = widen_interruptible(v, "v");
  Tensor<double> out64(out.shape(), "out");
  Tensor<double> lse64(std::array<int64_t, 3>{q.dim(0), q.dim(1), q.dim(2)}, "lse");
  reference_attention_forward(out64.view(), lse64.view(), {}, q64.cview(), k64.cview(), v64.cview(), options);
  const double* o = out64.data();
  for_each_element(out, [&](float& x, const auto&) { x = static_cast<float>(*o++); });
  const double* l = lse64.data();
  if (!lse.empty())
    for_each_element(lse, [&](L& x, const auto&) {
      if constexpr (std::is_same_v<L, float>)
        x = lse_to_float32(*l++);
      else
        x = *l++;
    });
}

AttentionShape check_forward(std::span<const int64_t> out, std::span<const int64_t> lse, std::span<const int64_t> q,
                             std::span<const int64_t> k, std::span<const int64_t> v, bool has_lse,
                             const AttentionOptions& options) {
  const AttentionShape s = check_attention_shapes(q, k, v, options);
  require_shape(out, std::array<int64_t, 4>{s.B, s.H, s.N, s.Dv}, "out");
  if (has_lse) require_shape(lse, std::array<int64_t, 3>{s.B, s.H, s.N}, "lse");
  return s;
}

// q, k, v of element type T (float or bf16), lse of L (float or double): checks, then the
// reference or the fused kernel.
template <class T, class L>
void forward_any(TensorView<float> out, TensorView<L> lse, TensorView<const T> q, TensorView<const T> k,
                 TensorView<const T> v, const AttentionOptions& options, const detail::Caller& caller = {}) {
  const AttentionShape s =
      check_forward(out.shape(), lse.shape(), q.shape(), k.shape(), v.shape(), !lse.empty(), options);
  std::vector<detail::NamedSpan> read = detail::read_spans(q, k, v, options.mask);
  detail::add_output(read, out, "out");
  detail::require_output(lse, "lse", read);
  if (options.kernel == Kernel::reference) {
    reference_forward_narrow(out, lse, q, k, v, options);
    return;
  }
  const Simd path = kernels::resolve_simd(options.simd);
  const detail::MaskEval mask(options.mask, s);
  kernels::ForwardParams p = kernels::forward_params(q, k, v, s, options, mask);
  p.out = out.data(), p.out_stride = kernels::strides_of(out);
  if constexpr (std::is_same_v<L, double>)
    p.lse_wide = lse.empty() ? nullptr : lse.data();
  else
    p.lse = lse.empty() ? nullptr : lse.data();
  p.lse_stride = kernels::strides_of(lse);
  std::atomic<bool> nonfinite{false}, emptied{false};
  p.nonfinite = &nonfinite;
  p.emptied = &emptied;
  kernels::forward(p, path, options.num_threads);  // the kernel resolves it by its work
  // The kernel flags a row with an allowed key that came out non-finite, or with every score -inf
  // (l = 0), as it writes the rows: no pass of its own.
  if (nonfinite.load() || emptied.load())
    detail::refuse_overflow(detail::fp32_overflow("attention_forward", caller), q, k, v, options.mask);
}

}  // namespace

void attention_forward(TensorView<float> out, TensorView<float> lse, TensorView<const float> q,
                       TensorView<const float> k, TensorView<const float> v, const AttentionOptions& options) {
  forward_any(out, lse, q, k, v, options);
}

void attention_forward(TensorView<float> out, TensorView<float> lse, TensorView<const bf16> q, TensorView<const bf16> k,
                       TensorView<const bf16> v, const AttentionOptions& options) {
  forward_any(out, lse, q, k, v, options);
}

void attention_forward_lse64(TensorView<float> out, TensorView<double> lse, TensorView<const float> q,
                             TensorView<const float> k, TensorView<const float> v, const AttentionOptions& options) {
  forward_any(out, lse, q, k, v, options);
}

void attention_forward_lse64(TensorView<float> out, TensorView<double> lse, TensorView<const bf16> q,
                             TensorView<const bf16> k, TensorView<const bf16> v, const AttentionOptions& options) {
  forward_any(out, lse, q, k, v, options);
}

void detail::attention_forward_as(const Caller& caller, TensorView<float> out, TensorView<double> lse,
                                  TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                                  const AttentionOptions& options) {
  forward_any(out, lse, q, k, v, options, caller);
}
void detail::attention_forward_as(const Caller& caller, TensorView<float> out, TensorView<float> lse,
                                  TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                                  const AttentionOptions& options) {
  forward_any(out, lse, q, k, v, options, caller);
}

const char* simd_path_name(Simd simd) { return simd_name(kernels::resolve_simd(simd)); }

}  // namespace qkv
