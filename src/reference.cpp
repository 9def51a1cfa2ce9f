#include "qkv/reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "mask_eval.h"
#include "qkv/interrupt.h"

namespace qkv {

// q: [B, H, N, D], k: [B, Hkv, M, D], v: [B, Hkv, M, Dv] -> out: [B, H, N, Dv], lse: [B, H, N],
// weights: [B, H, N, M]. One row of scores at a time, in float64, in a fixed order.
void reference_attention_forward(TensorView<double> out, TensorView<double> lse, TensorView<double> weights,
                                 TensorView<const double> q, TensorView<const double> k,
                                 TensorView<const double> v, const AttentionOptions& options) {
  const AttentionShape s = check_attention_shapes(q.shape(), k.shape(), v.shape(), options);
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(s.D));
  const detail::MaskEval mask(options.mask, s);
  const int64_t group = s.H / s.Hkv;
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  std::vector<double> row(static_cast<std::size_t>(s.M));
  InterruptScope* const interrupt = InterruptScope::current();  // polled once per query row

  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < s.N; ++i) {
        if (stop_requested(interrupt)) throw Interrupted();
        const detail::KeyBand band = mask.band(b, i);
        double row_max = kNegInf;
        bool saw_nan = false;
        for (int64_t j = band.lo; j < band.hi; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < s.D; ++d) dot += q(b, h, i, d) * k(b, hk, j, d);
          row[j] = mask.adjust(dot * scale, b, h, i, j);
          saw_nan |= std::isnan(row[j]);
          if (row[j] > row_max) row_max = row[j];
        }
        // A NaN score makes the whole row NaN, as IEEE arithmetic would; it is never masked away.
        if (saw_nan) row_max = std::numeric_limits<double>::quiet_NaN();
        const bool masked = band.empty() || row_max == kNegInf;
        double sum = 0.0;
        if (!masked) {
          for (int64_t j = band.lo; j < band.hi; ++j) {
            row[j] = std::exp(row[j] - row_max);
            sum += row[j];
          }
        }
        for (int64_t e = 0; e < s.Dv; ++e) {
          double acc = 0.0;
          if (!masked)
            for (int64_t j = band.lo; j < band.hi; ++j) acc += row[j] * v(b, hk, j, e);
          out(b, h, i, e) = masked ? 0.0 : acc / sum;
        }
        if (!lse.empty()) lse(b, h, i) = masked ? kNegInf : row_max + std::log(sum);
        if (!weights.empty()) {
          for (int64_t j = 0; j < s.M; ++j) {
            const bool in_band = !masked && j >= band.lo && j < band.hi;
            weights(b, h, i, j) = in_band ? row[j] / sum : 0.0;
          }
        }
      }
    }
  }
}

}  // namespace qkv
