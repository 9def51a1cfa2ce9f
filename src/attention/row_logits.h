// One query row of logits in float64: the single place where the float64 oracles (forward and
// backward) and the exact weights turn q, k and the masks into a row's scores.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/mask_eval.h"
#include "qkv/attention_options.h"
#include "qkv/interrupt.h"
#include "qkv/tensor.h"

namespace qkv::detail {

struct RowLogits {
  KeyBand band;        // keys outside it are masked
  double max = 0.0;    // the largest logit; NaN if any logit is NaN (a NaN is never masked away)
  bool masked = true;  // no allowed key: the row's output, weights and gradients are 0
};

// Query row i of (b, h), whose keys are those of kv head hk: logit[j] = the masked, scaled,
// softcapped, biased score q_i·k_j for j in the row's band (other entries untouched); raw[j], if
// raw is not null, receives the scaled score before the mask's adjustments (softcap's backward
// needs it). Products accumulate in float64 in the order d = 0, 1, ...
template <class T>
RowLogits row_logits(double* logit, double* raw, const MaskEval& mask, TensorView<const T> q, TensorView<const T> k,
                     double scale, int64_t b, int64_t h, int64_t hk, int64_t i) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  RowLogits row;
  row.band = mask.band(b, i);
  row.max = kNegInf;
  bool saw_nan = false;
  const int64_t D = q.dim(3);
  for (int64_t j = row.band.lo; j < row.band.hi; ++j) {
    double dot = 0.0;
    for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q(b, h, i, d)) * static_cast<double>(k(b, hk, j, d));
    if (raw != nullptr) raw[j] = dot * scale;
    logit[j] = mask.adjust(dot * scale, b, h, i, j);
    saw_nan |= std::isnan(logit[j]);
    row.max = std::max(row.max, logit[j]);
  }
  if (saw_nan) row.max = std::numeric_limits<double>::quiet_NaN();
  row.masked = row.band.empty() || row.max == kNegInf;
  return row;
}

// Replaces the band's logits by exp(logit - row.max) and returns their sum (call only for a row
// that is not masked).
inline double exp_in_place(double* logit, const RowLogits& row) {
  double sum = 0.0;
  for (int64_t j = row.band.lo; j < row.band.hi; ++j) {
    logit[j] = std::exp(logit[j] - row.max);
    sum += logit[j];
  }
  return sum;
}

// Calls f(b, h, hk, i) for every query row (hk: the row's kv head) in a fixed order, checking
// before each row whether the caller asked to stop (qkv::Interrupted): the oracles' row loop.
template <class F>
void for_each_query_row(const AttentionShape& s, F&& f) {
  InterruptScope* const interrupt = InterruptScope::current();
  const int64_t group = s.H / s.Hkv;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i) {
        if (stop_requested(interrupt)) throw Interrupted();
        f(b, h, h / group, i);
      }
}

}  // namespace qkv::detail
