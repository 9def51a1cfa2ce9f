// RoPE: one table of (cos, sin) per (batch row, token), shared by every head.
#include "qkv/rotary.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attention/output_checks.h"

namespace qkv {

namespace {

// Rotates every row of x by the validated options, or (write false) only looks for a finite element
// whose rotation overflows float32 and throws naming it.
void rotate(TensorView<float> x, std::span<const int64_t> offsets, const RotaryOptions& o,
            const std::vector<double>& inv_freq, bool write) {
  const int64_t B = x.dim(0), H = x.dim(1), N = x.dim(2), pairs = static_cast<int64_t>(inv_freq.size());
  // The second element of pair p: interleaved 2p + 1, half-split p + rd/2; the first 2p or p.
  const int64_t first_step = o.layout == RotaryLayout::interleaved ? 2 : 1;
  const int64_t second_gap = o.layout == RotaryLayout::interleaved ? 1 : pairs;
  std::vector<float> cs(static_cast<std::size_t>(2 * pairs));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t offset = offsets.empty() ? 0 : offsets[b];
    for (int64_t n = 0; n < N; ++n) {
      const double pos = static_cast<double>(offset + n);
      for (int64_t p = 0; p < pairs; ++p) {
        cs[2 * p] = static_cast<float>(std::cos(pos * inv_freq[p]));
        cs[2 * p + 1] = static_cast<float>(std::sin(pos * inv_freq[p]));
      }
      for (int64_t h = 0; h < H; ++h) {
        float* row = &x(b, h, n, 0);
        const int64_t sd = x.stride(3);
        for (int64_t p = 0; p < pairs; ++p) {
          const int64_t e0 = p * first_step, e1 = e0 + second_gap;
          float& a = row[e0 * sd];
          float& c = row[e1 * sd];
          const float x0 = a, x1 = c;
          const float y0 = x0 * cs[2 * p] - x1 * cs[2 * p + 1], y1 = x0 * cs[2 * p + 1] + x1 * cs[2 * p];
          if (write) {
            a = y0, c = y1;
          } else if (std::isfinite(x0) && std::isfinite(x1) && !(std::isfinite(y0) && std::isfinite(y1))) {
            const bool first = !std::isfinite(y0);
            const std::string where = (B > 1 ? fmt::format("batch row {}, ", b) : "") +
                                      (H > 1 ? fmt::format("head {}, ", h) : "") + fmt::format("token {}", n);
            throw Error(fmt::format(
                "apply_rotary: x at {}, element {} = {} turns into {} at position {} (with element {} = {}), past "
                "float32's 3.4e38; scale x down (it is unchanged)",
                where, first ? e0 : e1, first ? x0 : x1, first ? y0 : y1, offset + n, first ? e1 : e0,
                first ? x1 : x0));
          }
        }
      }
    }
  }
}

}  // namespace

void apply_rotary(TensorView<float> x, std::span<const int64_t> offsets, const RotaryOptions& o) {
  if (x.rank() != 4) throw Error(fmt::format("apply_rotary: x must be [B, H, N, D], got {}", shape_string(x.shape())));
  checked_numel(x.shape(), sizeof(float), "apply_rotary: x");
  detail::require_data(x, "apply_rotary: x");
  // A row shared by several (b, h, n) would turn once for each of them.
  if (may_self_overlap(x))
    throw Error(
        "apply_rotary: x: its strides make elements share memory (a stride-0 dimension, or strides that "
        "interleave); rotate a buffer with one place per element");
  const int64_t B = x.dim(0), N = x.dim(2), D = x.dim(3);
  const int64_t rd = o.rotary_dim == 0 ? D : o.rotary_dim;
  // Heads of no elements have nothing to turn, as any elementwise op on an empty array does nothing.
  if ((rd != 0 || D != 0) && (rd <= 0 || rd % 2 != 0 || rd > D))
    throw Error(fmt::format("apply_rotary: rotary_dim = {} must be even and in [2, D = {}]", rd, D));
  if (!(o.theta > 0) || !std::isfinite(o.theta))
    throw Error(fmt::format("apply_rotary: theta = {} must be positive", o.theta));
  if (o.layout != RotaryLayout::interleaved && o.layout != RotaryLayout::half_split)
    throw Error(fmt::format("apply_rotary: layout = {} is not a RotaryLayout (interleaved or half_split)",
                            static_cast<int>(o.layout)));
  if (!offsets.empty() && static_cast<int64_t>(offsets.size()) != B)
    throw Error(fmt::format("apply_rotary: {} offsets for B = {} batch rows", offsets.size(), B));
  // Every offset before any row turns: a refusal leaves x as it was.
  for (std::size_t b = 0; b < offsets.size(); ++b) {
    if (offsets[b] < 0) throw Error(fmt::format("apply_rotary: offsets[{}] = {} is negative", b, offsets[b]));
    if (N > 0 && offsets[b] > std::numeric_limits<int64_t>::max() - (N - 1))
      throw Error(
          fmt::format("apply_rotary: offsets[{}] = {} puts token {} past position 2^63 - 1", b, offsets[b], N - 1));
  }
  const int64_t pairs = rd / 2;
  if (pairs == 0) return;
  std::vector<double> inv_freq(static_cast<std::size_t>(pairs));
  for (int64_t p = 0; p < pairs; ++p)
    inv_freq[p] = std::pow(o.theta, -2.0 * static_cast<double>(p) / static_cast<double>(rd));
  // A theta below 1 makes the last pair's frequency the largest; a tiny one makes angles infinite.
  int64_t last = N - 1;
  for (int64_t offset : offsets) last = std::max(last, offset + (N - 1));
  const double widest = std::max(inv_freq.front(), inv_freq.back()) * static_cast<double>(std::max<int64_t>(last, 1));
  if (!std::isfinite(widest))
    throw Error(
        fmt::format("apply_rotary: theta = {} gives an infinite angle (the frequency theta^(-2p / "
                    "rotary_dim) times position {}); pass a larger theta",
                    o.theta, std::max<int64_t>(last, 1)));
  // Each result of a pair is at most |x0| + |x1|, so only an x holding an element above
  // FLT_MAX / 2 can turn a finite element into ±inf: such an x is rotated once without writing, and
  // refused (unchanged) at the first element that would overflow.
  float largest = 0;
  for_each_element(TensorView<const float>(x), [&](float v, const auto&) {
    if (std::isfinite(v)) largest = std::max(largest, std::fabs(v));
  });
  if (largest > std::numeric_limits<float>::max() / 2) rotate(x, offsets, o, inv_freq, false);
  rotate(x, offsets, o, inv_freq, true);
}

}  // namespace qkv
