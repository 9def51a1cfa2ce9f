// BackwardTile::renormalize (declared in backward_tile.h, included at its end): a row's max and
// normalizer rebuilt from its own logits when its lse is too large to carry them.
//
// P = exp(logit − lse) needs lse = max + log(Σ exp(logit − max)) to its last bits. A row whose
// every allowed key sits under a huge finite bias (-1e30, as masks built from finfo.min put it)
// has lse ≈ -1e30, where neither float nor double holds the log of the sum (up to log M): P came
// out as 1 per key instead of 1/M, and the row's gradients M times too large. Past kRenormFloat
// or kRenormWide (backward.h) the task takes one pass of its own over the row's key tiles first:
// the same scores (scores(), with the same dense sums in both passes), their max and, in double,
// the sum of exp(logit − max). The main pass then uses max as lse's high part and the log of the
// sum as its low part, so logit − max stays exact as in the forward. The pass's exponentials are
// the main pass's own (probabilities() with the running max as lse): with every row renormalized
// a call takes 1.7x one without (S3's shape under a bias, 1 thread; 2.2x with one exp per logit in
// double). Rows of a part of the keys (the ring's blocks) keep their lse: it is the whole row's.
#pragma once

#include <cmath>

namespace qkv::kernels {
namespace {

template <class Ops>
void BackwardTile<Ops>::renormalize(int64_t h) {
  for (int64_t row = 0; row < r1_ - r0_; ++row)
    if (renorm_[row]) norm_max_[row] = kNegInf, norm_log_[row] = 0.0;
  for (int64_t j0 = first_group(); j0 < keys_.hi; j0 += span()) {
    if (stop_requested(p_.interrupt)) return;
    const int64_t keys = std::min(span(), seen_.hi - j0);
    pack_keys(j0, keys);
    for (int64_t i0 = r0_; i0 < r1_; i0 += T) {
      const int64_t row = i0 - r0_, rows = std::min(T, r1_ - i0);
      if (std::none_of(renorm_ + row, renorm_ + row + rows, [](int8_t x) { return x != 0; })) continue;
      tile_rows(h, i0, rows);
      for (int64_t t = 0; t * T < keys; ++t) {
        const int64_t jt = j0 + t * T, cols = std::min(T, keys - t * T);
        if (!tile_bands(rows, jt, cols)) continue;
        scores(h, i0, rows, jt, cols, t);
        // Each renormalized row's running max takes the tile's, its sum rescaled to it; then the
        // tile's exp(logit − max) through probabilities() itself, summed in double.
        for (int64_t r = 0; r < rows; ++r) {
          if (!renorm_[row + r]) continue;
          float& m = norm_max_[row + r];
          float tile_max = kNegInf;
          for (int64_t c = std::max<int64_t>(lo_[r], 0); c < std::min(hi_[r], cols); ++c)
            tile_max = std::max(tile_max, st_[r * T + c]);  // a NaN is the forward's to refuse
          if (tile_max > m) norm_log_[row + r] *= std::exp(static_cast<double>(m) - tile_max), m = tile_max;
          lse_[r] = m > kNegInf ? m : 0.0f, lse_lo_[r] = 0.0f;  // until a finite logit, every P is 0
        }
        probabilities(rows);
        for (int64_t r = 0; r < rows; ++r) {
          if (!renorm_[row + r]) continue;
          double sum = 0.0;  // columns past the band hold P = 0
          for (int64_t c = 0; c < T; ++c) sum += st_[r * T + c];
          norm_log_[row + r] += sum;  // the running sum until the end of the pass
        }
      }
    }
  }
  // The row's own max + log(sum) must be the lse given (same_row_lse): an lse from elsewhere is
  // kept, and what it gives refused as ever (overflow.h). So is a row left without a finite
  // normalizer.
  for (int64_t row = 0; row < r1_ - r0_; ++row)
    if (renorm_[row]) {
      const double sum = norm_log_[row], given = row_lse(h, r0_ + row);
      const double own = static_cast<double>(norm_max_[row]) + std::log(sum);
      renorm_[row] = sum > 0.0 && std::isfinite(sum) && same_row_lse(own, given, p_.lse_wide != nullptr);
      norm_log_[row] = renorm_[row] ? std::log(sum) : 0.0;
    }
}

}  // namespace
}  // namespace qkv::kernels
