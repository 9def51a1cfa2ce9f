// MaskEval: the one place that turns a qkv::Mask into per-row key bands and per-element score
// adjustments. The reference and the fused kernels both use it, so their semantics cannot drift.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/softcap.h"
#include "qkv/attention_options.h"

namespace qkv::detail {

// Keys outside [lo, hi) are masked for a row; lo >= hi means the row is fully masked.
struct KeyBand {
  int64_t lo = 0;
  int64_t hi = 0;
  bool empty() const { return lo >= hi; }
};

// Whether bands[0, n) lie as lengths, a causal mask and a window make them: the non-empty bands
// form one run, along which lo and hi never decrease. The rows that see any of keys [a, b) then
// form one run too, found without visiting the others (a narrow window over a long sequence).
inline bool bands_ordered(const KeyBand* bands, int64_t n) {
  int64_t first = 0, last = n;
  while (first < n && bands[first].empty()) ++first;
  while (last > first && bands[last - 1].empty()) --last;
  for (int64_t i = first + 1; i < last; ++i)
    if (bands[i].empty() || bands[i].lo < bands[i - 1].lo || bands[i].hi < bands[i - 1].hi) return false;
  return true;
}

class MaskEval {
 public:
  MaskEval(const Mask& mask, const AttentionShape& shape) : mask_(mask), shape_(shape) {}

  int64_t valid_queries(int64_t b) const { return mask_.query_lengths.empty() ? shape_.N : mask_.query_lengths[b]; }
  int64_t valid_keys(int64_t b) const { return mask_.key_lengths.empty() ? shape_.M : mask_.key_lengths[b]; }

  // The key index on the diagonal for query i of batch row b.
  int64_t diagonal(int64_t b, int64_t i) const {
    const int64_t offset = mask_.diagonal_offsets.empty() ? 0 : mask_.diagonal_offsets[b];
    return (mask_.align() == CausalAlign::bottom_right ? i + valid_keys(b) - valid_queries(b) : i) + offset;
  }

  // Keys allowed for query i of batch row b by lengths, causal and window.
  KeyBand band(int64_t b, int64_t i) const {
    if (i >= valid_queries(b)) return {0, 0};
    KeyBand band{0, valid_keys(b)};
    const int64_t d = diagonal(b, i);
    if (mask_.causal) band.hi = std::min(band.hi, d + 1);
    if (mask_.window) {
      // A bound of |d| + M or more reaches past every key, so clamping to it keeps the band and
      // keeps d ± bound from overflowing (a window of INT64_MAX means "everything on that side").
      const int64_t reach = shape_.M + (d < 0 ? -d : d);
      if (mask_.window->left >= 0) band.lo = std::max(band.lo, d - std::min(mask_.window->left, reach));
      if (mask_.window->right >= 0) band.hi = std::min(band.hi, d + std::min(mask_.window->right, reach) + 1);
    }
    band.lo = std::max<int64_t>(band.lo, 0);
    return band;
  }

  // Whether query i of (b, h) has a key that its band, the keep-mask and the bias (not -inf) allow.
  // A row that has one yet came out with every logit -inf had its scores overflow (overflow.h).
  // O(M) for a row the masks empty; called only for rows that came out empty.
  bool row_has_allowed_key(int64_t b, int64_t h, int64_t i) const {
    const KeyBand kb = band(b, i);
    for (int64_t j = kb.lo; j < kb.hi; ++j)
      if (keeps(b, h, i, j)) return true;
    return false;
  }

  // True if scores need per-element work beyond the band (keep-mask, bias, ALiBi, softcap).
  bool has_elementwise() const { return has_terms_after_softcap() || mask_.softcap > 0; }
  // The elementwise terms that come after softcap: keep-mask, bias, ALiBi.
  bool has_terms_after_softcap() const {
    return !mask_.keep.empty() || !mask_.bias.empty() || !mask_.alibi_slopes.empty();
  }

  // Turns a scaled score of an in-band pair into the final logit; -inf if the keep-mask removes it.
  template <class T>
  T adjust(T s, int64_t b, int64_t h, int64_t i, int64_t j) const {
    return add_terms(mask_.softcap > 0 ? softcap(s) : s, b, h, i, j);
  }

  // cap·tanh(s/cap): fp32 scores through softcap.h (the kernels capping a block at once with
  // softcap_scores get the same bits), the float64 reference through std::tanh.
  template <class T>
  T softcap(T s) const {
    if constexpr (std::is_same_v<T, float>)
      return softcap_score(s, mask_.softcap);
    else
      return T(mask_.softcap) * std::tanh(s / T(mask_.softcap));
  }

  // Whether in-band pair (b, h, i, j) is a key of the row at all: not removed by the keep-mask or
  // a -inf bias. A weight that merely underflowed to 0 still belongs to such a key.
  bool keeps(int64_t b, int64_t h, int64_t i, int64_t j) const { return std::isfinite(adjust(0.0, b, h, i, j)); }

  // adjust() after softcap: a score already capped (or with softcap off) through the other terms.
  template <class T>
  T add_terms(T s, int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (!mask_.keep.empty() && mask_.keep(b, h, i, j) == 0) return -std::numeric_limits<T>::infinity();
    if (!mask_.bias.empty()) s += T(mask_.bias(b, h, i, j));
    if (!mask_.alibi_slopes.empty()) {
      const int64_t distance = j > diagonal(b, i) ? j - diagonal(b, i) : diagonal(b, i) - j;
      s -= T(mask_.alibi_slopes[h]) * T(distance);
    }
    return s;
  }

  const Mask& mask() const { return mask_; }

 private:
  const Mask& mask_;
  AttentionShape shape_;
};

}  // namespace qkv::detail
