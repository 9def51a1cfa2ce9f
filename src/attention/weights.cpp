#include "qkv/weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "attention/output_checks.h"
#include "attention/overflow.h"
#include "attention/top_k.h"
#include "kernels/backward.h"
#include "kernels/mask_eval.h"
#include "qkv/interrupt.h"
#include "qkv/out_of_memory.h"

namespace qkv {
namespace {

struct RowProblem {
  AttentionShape s;
  double scale = 1.0;
  int64_t group = 1;
};

RowProblem check(TensorView<const float> q, TensorView<const float> k, TensorView<const float> lse,
                 std::span<const int64_t> rows, const AttentionOptions& options) {
  // Weights do not involve v: check q and k with a stand-in v of the right [B, Hkv, M].
  const std::array<int64_t, 4> v_shape{k.rank() == 4 ? k.dim(0) : 0, k.rank() == 4 ? k.dim(1) : 0,
                                       k.rank() == 4 ? k.dim(2) : 0, 1};
  RowProblem p;
  p.s = check_attention_shapes(q.shape(), k.shape(), v_shape, options);
  p.scale = attention_scale(options.scale, p.s.D);
  p.group = p.s.H / p.s.Hkv;
  const std::array<int64_t, 3> want_lse{p.s.B, p.s.H, p.s.N};
  if (!lse.empty()) require_shape(lse.shape(), want_lse, "lse");
  for (std::size_t r = 0; r < rows.size(); ++r)
    if (rows[r] < 0 || rows[r] >= p.s.N)
      throw Error(fmt::format("rows[{}] = {} is outside [0, {})", r, rows[r], p.s.N));
  return p;
}

// q·k in float64 with eight partial sums added in a fixed order: the products of two floats are
// exact in double, and independent sums let the loop pipeline (one running sum waited ~4 cycles
// per term: 65,000² keys of 50 dims took minutes). Deterministic: the order never depends on
// threads.
double dot_row(const float* q, const float* k, int64_t D, int64_t q_step, int64_t k_step) {
  double part[8] = {};
  int64_t d = 0;
  if (q_step == 1 && k_step == 1) {
    for (; d + 8 <= D; d += 8)
      for (int u = 0; u < 8; ++u) part[u] += static_cast<double>(q[d + u]) * k[d + u];
  }
  for (; d < D; ++d) part[d % 8] += static_cast<double>(q[d * q_step]) * k[d * k_step];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// Fills w[j] (j in [0, M)) with the masked, scaled logits of query row i of (b, h) and returns
// the row's log-sum-exp (the given lse, else computed); -inf if the row is fully masked (then w
// is all 0). A computed lse and the logits are both taken relative to the row's max, so a huge
// bias (finfo.min) does not swallow log(sum). Weights are exp(w[j] - lse): callers exponentiate
// only the entries they keep.
double row_logits(std::vector<double>& w, const RowProblem& p, const detail::MaskEval& mask, TensorView<const float> q,
                  TensorView<const float> k, TensorView<const float> lse, int64_t b, int64_t h, int64_t i) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  std::fill(w.begin(), w.end(), kNegInf);
  const detail::KeyBand band = mask.band(b, i);
  const int64_t hk = h / p.group;
  double row_max = kNegInf;
  bool saw_nan = false;
  const float* qi = &q(b, h, i, 0);
  for (int64_t j = band.lo; j < band.hi; ++j) {
    const double dot = dot_row(qi, &k(b, hk, j, 0), p.s.D, q.stride(3), k.stride(3));
    w[j] = mask.adjust(dot * p.scale, b, h, i, j);
    saw_nan |= std::isnan(w[j]);
    row_max = std::max(row_max, w[j]);
  }
  if (saw_nan) row_max = std::numeric_limits<double>::quiet_NaN();
  if (band.empty() || row_max == kNegInf) {
    std::fill(w.begin(), w.end(), 0.0);
    return kNegInf;
  }
  // A given lse past kRenormFloat carries more than 2^-14 of rounding into every weight (32 at a
  // -1e9 mask): the row's own replaces it where it is that row's (the backward's rule).
  const bool given = !lse.empty();
  if (given && std::abs(lse(b, h, i)) <= kernels::kRenormFloat) return lse(b, h, i);
  double sum = 0.0;
  for (int64_t j = band.lo; j < band.hi; ++j) sum += std::exp(w[j] - row_max);
  if (given && !kernels::same_row_lse(row_max + std::log(sum), lse(b, h, i), false)) return lse(b, h, i);
  for (int64_t j = band.lo; j < band.hi; ++j) w[j] -= row_max;
  return std::log(sum);
}

// What a caller can do about weights past float32: only an lse below the row's own (the forward's
// for other inputs, or made up) gives weights above 1; without one every weight is at most 1.
constexpr detail::Overflow kWeightsOverflow{
    "attention_weights",
    "float32",
    "3.4e38",
    "pass the lse the forward returned for these q, k, mask and scale, or no lse to recompute it",
    "q and k",
    "weights e^(score - lse)"};

// The chosen rows' given lse by the rule for a caller's lse (impossible_lse): a row not chosen is
// not read. The row is named by its indices alone, as lse may be [B, H, N], [H, N] or [N].
void refuse_impossible_lse(const RowProblem& p, TensorView<const float> q, TensorView<const float> k,
                           TensorView<const float> lse, std::span<const int64_t> rows, const Mask& mask) {
  if (lse.empty()) return;
  for (int64_t b = 0; b < p.s.B; ++b)
    for (int64_t h = 0; h < p.s.H; ++h)
      for (const int64_t i : rows) {
        const double x = lse(b, h, i);
        if (!detail::impossible_lse(x)) continue;
        if (detail::inputs_explain_overflow(q, k, k, mask)) return;
        detail::refuse_impossible_lse(kWeightsOverflow.who,
                                      fmt::format("the lse of query row {} (batch {}, head {})", i, b, h), x,
                                      kWeightsOverflow.inputs, kWeightsOverflow.remedy);
      }
}

// Runs fn(b, h, r, w, row_lse) for every chosen row on the option's threads, each row on one
// thread, w holding the row's logits (see row_logits); row_lse is -inf for a fully masked row
// (or given as -inf, which attention_backward also reads as one).
// fn returns whether the weights it wrote are finite; if one is not, it is refused by
// attention_backward's rule (refuse_overflow): finite q, k and bias do not explain it, and the
// chosen rows' lse holds no NaN or +inf by then (refuse_impossible_lse).
template <class Fn>
void for_each_row(const RowProblem& p, std::span<const int64_t> rows, const AttentionOptions& options,
                  TensorView<const float> q, TensorView<const float> k, TensorView<const float> lse, Fn fn) {
  refuse_impossible_lse(p, q, k, lse, rows, options.mask);
  const detail::MaskEval mask(options.mask, p.s);
  const int64_t R = static_cast<int64_t>(rows.size());
  const int64_t items = p.s.B * p.s.H * R;
  const int threads = resolve_num_threads(options.num_threads, items);
  InterruptScope* const interrupt = InterruptScope::current();  // skips the remaining rows
  if (interrupt != nullptr) interrupt->set_total(items);
  std::atomic<bool> finite{true}, failed{false};
#pragma omp parallel num_threads(threads)
  {
    // An exception must not leave the region (std::terminate): a thread that cannot allocate its
    // row, or whose row fails, stops taking rows, and the call throws after the region.
    std::vector<double> w;
    try {
      w.resize(static_cast<std::size_t>(p.s.M));
    } catch (...) {
      failed.store(true, std::memory_order_relaxed);
    }
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < items; ++item) {
      if (stop_requested(interrupt) || failed.load(std::memory_order_relaxed)) continue;
      const int64_t r = item % R, h = item / R % p.s.H, b = item / R / p.s.H;
      try {
        if (!fn(b, h, r, w, row_logits(w, p, mask, q, k, lse, b, h, rows[r])))
          finite.store(false, std::memory_order_relaxed);
      } catch (...) {
        failed.store(true, std::memory_order_relaxed);
      }
      if (interrupt != nullptr) interrupt->advance();
    }
  }
  if (failed.load())
    throw OutOfMemory("attention weights: a row of " + std::to_string(p.s.M) + " float64 logits per thread",
                      static_cast<uint64_t>(p.s.M) * sizeof(double) * static_cast<uint64_t>(threads));
  throw_if_stopped(interrupt);
  if (finite.load()) return;
  detail::refuse_overflow<float>(kWeightsOverflow, q, k, k, options.mask);
}

// What the weights functions read, which their outputs must not share memory with.
std::vector<detail::NamedSpan> inputs_of(TensorView<const float> q, TensorView<const float> k,
                                         TensorView<const float> lse, const AttentionOptions& options) {
  std::vector<detail::NamedSpan> read = detail::read_spans(q, k, TensorView<const float>(), options.mask);
  read.push_back(detail::named_span("lse", lse));
  return read;
}

}  // namespace

void attention_weights_rows(TensorView<float> weights, TensorView<const float> q, TensorView<const float> k,
                            TensorView<const float> lse, std::span<const int64_t> rows,
                            const AttentionOptions& options) {
  const RowProblem p = check(q, k, lse, rows, options);
  const int64_t R = static_cast<int64_t>(rows.size());
  require_shape(weights.shape(), std::array<int64_t, 4>{p.s.B, p.s.H, R, p.s.M}, "weights");
  detail::require_output(weights, "weights", inputs_of(q, k, lse, options));
  for_each_row(
      p, rows, options, q, k, lse, [&](int64_t b, int64_t h, int64_t r, const std::vector<double>& w, double row_lse) {
        bool finite = true;
        for (int64_t j = 0; j < p.s.M; ++j) {
          const float x =
              row_lse == -std::numeric_limits<double>::infinity() ? 0.0f : static_cast<float>(std::exp(w[j] - row_lse));
          finite = finite && std::isfinite(x);
          weights(b, h, r, j) = x;
        }
        return finite;
      });
}

void attention_weights_topk(TensorView<float> values, TensorView<int64_t> indices, TensorView<const float> q,
                            TensorView<const float> k, TensorView<const float> lse, std::span<const int64_t> rows,
                            int64_t topk, const AttentionOptions& options) {
  detail::require_top_k(topk, "attention_weights_topk");
  const RowProblem p = check(q, k, lse, rows, options);
  const int64_t R = static_cast<int64_t>(rows.size());
  require_shape(values.shape(), std::array<int64_t, 4>{p.s.B, p.s.H, R, topk}, "top-k values");
  require_shape(indices.shape(), std::array<int64_t, 4>{p.s.B, p.s.H, R, topk}, "top-k indices");
  std::vector<detail::NamedSpan> read = inputs_of(q, k, lse, options);
  detail::add_output(read, values, "top-k values");
  detail::require_output(indices, "top-k indices", read);
  const detail::MaskEval mask(options.mask, p.s);
  for_each_row(p, rows, options, q, k, lse,
               [&](int64_t b, int64_t h, int64_t r, const std::vector<double>& w, double row_lse) {
                 const bool live = row_lse != -std::numeric_limits<double>::infinity();
                 const int64_t i = rows[r];
                 const detail::KeyBand band = mask.band(b, i);
                 // A weight that merely underflowed to 0 still counts as allowed (MaskEval::keeps).
                 std::vector<int64_t> keys;
                 for (int64_t j = band.lo; live && j < band.hi; ++j)
                   if (mask.keeps(b, h, i, j)) keys.push_back(j);
                 const int64_t n = std::min<int64_t>(topk, static_cast<int64_t>(keys.size()));
                 detail::order_top_k(keys, n, w);
                 bool finite = true;
                 for (int64_t t = 0; t < topk; ++t) {
                   values(b, h, r, t) = t < n ? static_cast<float>(std::exp(w[keys[t]] - row_lse)) : 0.0f;
                   finite = finite && std::isfinite(values(b, h, r, t));
                   indices(b, h, r, t) = t < n ? keys[t] : -1;
                 }
                 return finite;
               });
}

}  // namespace qkv
