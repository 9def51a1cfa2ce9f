// The screens of large_scores.h: where large scores spread far (q·50: ~±150), the forward sums
// again only the scores near each row's running largest (refine_near_max) and the backward only
// those near each row's lse (refine_near_lse); the others keep the fp32 product, whose error cannot
// reach a sum of P. Include only after kernel_deps.h and a family's <isa>/ops.h.
#pragma once

#include "kernels/large_scores.h"

namespace qkv::kernels {
namespace {

// The fp32 product's error, relative to scale·|q|·|k| (Euclidean norms): one FMA chain over D
// terms and the scaling round to (D + 1)·2⁻²⁴ (Cauchy-Schwarz bounds Σ|q_d·k_d|); four times that,
// for the rounding of the norms and of this bound itself.
inline float product_error(float scale, int64_t D) { return scale * static_cast<float>(D + 2) * 0x1p-22f; }

// How far under its row's largest fp32 score a score of each lane (|q| = q_sizes[x], keys of |k| up
// to k_bound, `keys` of them) may lie and still be summed again by refine_near_max: twice the
// product's error e (in the score and in the largest) and T = ln(2³⁰·max(1, keys·e)). A score that
// far under its row's true largest weighs under e^-T of it, so the keys left in fp32 carry, all of
// them together, under 2⁻³⁰ relative error into l and O. Past the float range the margin is inf and
// every score passes; a lane without q (0) gets -inf, so that none of its scores is looked at.
inline void near_max_margins(const float* q_sizes, int64_t lanes, float k_bound, float scale, int64_t kdim,
                             int64_t keys, float* margin) {
  const float e = product_error(scale, kdim) * k_bound;
  for (int64_t x = 0; x < lanes; ++x) {
    const float error = e * q_sizes[x];
    margin[x] = q_sizes[x] > 0.0f ? 2.0f * error + std::log(0x1p30f * std::max(1.0f, static_cast<float>(keys) * error))
                                  : -std::numeric_limits<float>::infinity();
  }
}

// Σ_d a[d]·b[d] for d < n in double (exact products): eight partial sums, d mod 8, added in one
// fixed tree, then the last n mod 8 terms in order. The same bits in every family, whatever the
// width of its registers (each holds a run of the eight).
template <class Ops>
double near_max_dot(const float* a, const float* b, int64_t n) {
  using D = DoubleReg<Ops>;
  constexpr int W = sizeof(D) / sizeof(double), R = 8 / W;
  using F = typename RegisterVector<float, W>::type;  // to widen into D
  D sum[R];
  for (int v = 0; v < R; ++v) sum[v] = D{};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int v = 0; v < R; ++v) {
      F x, y;
      std::memcpy(&x, a + d + v * W, sizeof x);
      std::memcpy(&y, b + d + v * W, sizeof y);
      D wx, wy;
      widen_floats(x, wx);
      widen_floats(y, wy);
      sum[v] += wx * wy;
    }
  double p[8];
  std::memcpy(p, sum, sizeof p);
  double total = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
  for (; d < n; ++d) total += static_cast<double>(a[d]) * static_cast<double>(b[d]);
  return total;
}

// Whether the family adds low parts under a mask of lanes (Ops::add_where), reading only those.
template <class Ops>
constexpr bool kMaskedLowParts = requires(typename Ops::V x, const float* p) {
  Ops::add_where(x, 0u, p);
};

// x + lo[i] in the lanes i whose bit is set in `bits` (bit 0 the first lane), x in the others: a
// row of scores and its low parts (lo_bits[row] >> first lane), which the forward's screen writes
// for the scores it chose only (sum_chosen), and refine_scores for all (every bit set). A family
// that cannot mask its loads adds every lane; sum_chosen writes 0 to the others for it.
template <class Ops>
typename Ops::V add_low_parts(typename Ops::V x, uint64_t bits, const float* lo) {
  if constexpr (kMaskedLowParts<Ops>)
    return Ops::add_where(x, static_cast<uint32_t>(bits), lo);
  else
    return Ops::add(x, Ops::load(lo));
}

// The `count` scores of s named in chosen (row·kWideCols + lane) summed again: row r against lane x
// is Σ_d a_r[d]·b_x[d] (a_r = a + r·a_row, b_x = b + x·b_row) by near_max_dot, whose products
// commute, so the forward (rows of k) and the backward (rows of q) get the same bits; scaled in
// double and split into s and s_lo (rows x lds). With lo_bits, where the family masks its loads,
// the other low parts are left as they were and lo_bits[r] names row r's written lanes
// (add_low_parts); else they are 0. Clearing a forward block's 128 x 64 took 2-3% of S3q50's time;
// the backward's 64 x 64 cost less than masking its adds.
template <class Ops>
void sum_chosen(const float* a, int64_t a_row, const float* b, int64_t b_row, int64_t kdim, float scale, float* s,
                float* s_lo, uint64_t* lo_bits, int64_t lds, int64_t rows, const uint32_t* chosen, int64_t count) {
  const bool masked = kMaskedLowParts<Ops> && lo_bits != nullptr;
  if (masked)
    std::fill(lo_bits, lo_bits + rows, uint64_t{0});
  else
    std::fill(s_lo, s_lo + rows * lds, 0.0f);
  for (int64_t c = 0; c < count; ++c) {
    const int64_t r = chosen[c] / kWideCols, x = chosen[c] % kWideCols;
    const double score = near_max_dot<Ops>(a + r * a_row, b + x * b_row, kdim) * static_cast<double>(scale);
    split_logit(score, s[r * lds + x], s_lo[r * lds + x]);
    if (masked) lo_bits[r] |= uint64_t{1} << x;
  }
}

// refine_near_max's first pass: thr[x] = the larger of m[x] (the lane's running maximum over the
// blocks before) and the block's largest scaled score, less margin[x]. The block's largest is
// block_max[x]·scale where the scores' product took the block's maxima of the unscaled scores as it
// stored them (scale > 0: rounding is monotone, so that is the largest of the scaled scores), else
// the largest of s·scale (a block of `nb` rows of keys against `lanes` lanes, lds apart), read here.
// s is not written: near_max_choose scales it. False if a score it reads is inf or NaN (thr is
// written either way). Keys outer: each group's maximum is its own chain (with keys inner, each max
// waited on the one before).
template <class Ops>
bool near_max_thresholds(const float* s, int64_t lds, int64_t nb, int64_t lanes, float scale, const float* block_max,
                         const float* m, const float* margin, float* thr) {
  using V = typename Ops::V;
  constexpr int L = Ops::kLanes;
  const int64_t groups = lanes / L;
  const V sc = Ops::set1(scale);
  V mx[kWideCols / L], finite[kWideCols / L];  // finite: s·0 summed, NaN where a score is inf or NaN
  for (int64_t g = 0; g < groups; ++g) {
    mx[g] = Ops::load(m + g * L), finite[g] = Ops::zero();
    if (block_max != nullptr) mx[g] = Ops::max(Ops::mul(Ops::load(block_max + g * L), sc), mx[g]);
  }
  for (int64_t jj = 0; block_max == nullptr && jj < nb; ++jj)
    for (int64_t g = 0; g < groups; ++g) {
      const V x = Ops::mul(Ops::load(s + jj * lds + g * L), sc);
      mx[g] = Ops::max(x, mx[g]);
      finite[g] = Ops::fma(x, Ops::zero(), finite[g]);
    }
  bool all_finite = true;
  for (int64_t g = 0; g < groups; ++g) {
    all_finite = all_finite && !Ops::any_nan(finite[g]);
    Ops::store(thr + g * L, Ops::sub(mx[g], Ops::load(margin + g * L)));
  }
  return all_finite;
}

// Room for the chosen scores of a block of `scores`: the screens stop past one in eight, and
// choose_row_packed may take one more row of kWideCols before near_max_choose looks.
constexpr int64_t chosen_room(int64_t scores) { return scores / 8 + kWideCols; }

// Whether the family packs the set lanes of a mask into memory (Ops::append_lanes).
template <class Ops>
constexpr bool kPacksLanes = requires(uint32_t* out) {
  Ops::append_lanes(0u, 0, out);
};

// The L scores at p scaled in place by sc, returned; finite gathers them ·0 (NaN where one is inf
// or NaN). near_max_choose's one pass over a block.
template <class Ops>
typename Ops::V scale_in_place(float* p, typename Ops::V sc, typename Ops::V& finite) {
  const typename Ops::V x = Ops::mul(Ops::load(p), sc);
  Ops::store(p, x);
  finite = Ops::fma(x, Ops::zero(), finite);
  return x;
}

// One key's row of near_max_choose without branches on the scores, for a family that packs lanes:
// scales the row s in place, and appends to chosen[count, ...) key·kWideCols + x for each lane x <
// lanes whose scaled score reaches thr[x] and, unless `every` says all do, whose norms pass limit
// (refined(size, sizes[x])), in ascending order; returns the new count. finite gathers s·0 (NaN
// where a score is inf or NaN). The running maxima let one or two scores in a hundred through at
// random, and a branch per passing score cost the screen most of its time there (with AVX2's masks
// and no packing, the branches measured faster).
template <class Ops, bool kEvery>
int64_t choose_row_packed(float* s, typename Ops::V sc, const float* thr, float size, const float* sizes, int64_t lanes,
                          float limit, int64_t key, uint32_t* chosen, int64_t count, typename Ops::V& finite) {
  using V = typename Ops::V;
  constexpr int L = Ops::kLanes;
  const V a = Ops::set1(size), lim = Ops::set1(limit);
  for (int64_t g = 0; g < lanes / L; ++g) {
    const V x = scale_in_place<Ops>(s + g * L, sc, finite);
    uint32_t bits = Ops::ge_mask(x, Ops::load(thr + g * L));
    if constexpr (!kEvery) {
      const V norms = Ops::mul(a, Ops::load(sizes + g * L));
      // refined() is a strict compare that fails on NaN: both ge_masks.
      bits &= Ops::ge_mask(norms, lim) & ~Ops::ge_mask(lim, norms);
    }
    count += Ops::append_lanes(bits, static_cast<int32_t>(key * kWideCols + g * L), chosen + count);
  }
  return count;
}

// refine_near_max's second pass: s (nb rows of keys against `lanes` lanes, lds apart) scaled in
// place by `scale`, and the (key, lane) of each scaled score at or over its lane's thr whose norms
// pass `limit` (refined(); every: the caller found that all do), as key·kWideCols + lane, into
// chosen (chosen_room); their count, or -1 past one score in eight, where summing them one by one
// would not pay, or where a score is inf or NaN. All of s is scaled either way.
template <class Ops>
int64_t near_max_choose(float* s, int64_t lds, int64_t nb, int64_t lanes, float scale, const float* thr,
                        const float* k_sizes, const float* q_sizes, float limit, bool every, uint32_t* chosen) {
  using V = typename Ops::V;
  constexpr int L = Ops::kLanes;
  const int64_t most = nb * lanes / 8;
  const V sc = Ops::set1(scale);
  V finite = Ops::zero();
  int64_t count = 0, jj = 0;
  for (; jj < nb && count <= most; ++jj) {
    float* row = s + jj * lds;
    if constexpr (kPacksLanes<Ops>) {
      count = every ? choose_row_packed<Ops, true>(row, sc, thr, k_sizes[jj], q_sizes, lanes, limit, jj, chosen, count,
                                                   finite)
                    : choose_row_packed<Ops, false>(row, sc, thr, k_sizes[jj], q_sizes, lanes, limit, jj, chosen, count,
                                                    finite);
    } else {
      uint64_t bits = 0;  // a key's lanes in one mask
      for (int64_t g = 0; g < lanes / L; ++g) {
        const V x = scale_in_place<Ops>(row + g * L, sc, finite);
        bits |= static_cast<uint64_t>(Ops::ge_mask(x, Ops::load(thr + g * L))) << (g * L);
      }
      for (; bits != 0 && count <= most; bits &= bits - 1) {
        const int64_t x = std::countr_zero(bits);
        if (every || refined(k_sizes[jj], q_sizes[x], limit))
          chosen[count++] = static_cast<uint32_t>(jj * kWideCols + x);
      }
    }
  }
  for (; jj < nb; ++jj)  // past `most`: the rest scaled for refine_scores
    for (int64_t g = 0; g < lanes / L; ++g) scale_in_place<Ops>(s + jj * lds + g * L, sc, finite);
  return count > most || Ops::any_nan(finite) ? -1 : count;
}

// The forward's cheaper form of refine_scores for a block where the row maxima decide: s holds
// the block's fp32 products, rows of keys (k + jj·k_row, contiguous) against lanes of queries
// (q + x·q_row, contiguous), scaled here in place; m the lanes' running maxima over the blocks
// before, margin near_max_margins', block_max the block's maxima of the unscaled scores where the
// product took them (else null: near_max_thresholds). A score is summed again, as refine_scores
// would (refined(): the same norms and limit; `every` where the caller found that all pass), only
// where its fp32 value reaches the larger of m and the block's largest less the margin: with q·50
// (scores ~±150) that leaves ~1-2% of them; the others keep the fp32 product and no low part
// (sum_chosen). The sums differ from refine_scores' in order (the last bits of a score of weight >
// e^-T, docs/accuracy.md). Returns false, with the scores scaled and nothing else written, where it
// would not pay (more than one score in eight to sum) or where a score is not finite: then
// refine_scores takes the block.
template <class Ops>
bool refine_near_max(const float* k, int64_t k_row, const float* k_sizes, const float* q, int64_t q_row,
                     const float* q_sizes, int64_t kdim, float scale, float* s, float* s_lo, uint64_t* lo_bits,
                     int64_t lds, int64_t nb, int64_t lanes, const float* block_max, const float* m,
                     const float* margin, float limit, bool every) {
  alignas(64) float thr[kWideCols];
  uint32_t chosen[chosen_room(Ops::kKeyBlock * kWideCols)];  // nb <= kKeyBlock, lanes <= kWideCols
  const bool finite = near_max_thresholds<Ops>(s, lds, nb, lanes, scale, block_max, m, margin, thr);
  // Called either way, as it scales s (and finds any score that is not finite again).
  const int64_t count = near_max_choose<Ops>(s, lds, nb, lanes, scale, thr, k_sizes, q_sizes, limit, every, chosen);
  if (!finite || count < 0) return false;
  sum_chosen<Ops>(k, k_row, q, q_row, kdim, scale, s, s_lo, lo_bits, lds, nb, chosen, count);
  return true;
}

// Whether refine_near_max would have taken a block whose scores s (scaled) refine_scores summed
// again, every one of them: then the forward pays the fp32 product of the next blocks, which it
// needs, in the hope of the same. Scores of q·4 or q·8 lie too close for the margin, and a first
// block that computed the product for nothing cost them 6-24% at 128-256 keys (Zen 5).
template <class Ops>
bool near_max_separates(float* s, int64_t lds, int64_t nb, int64_t lanes, const float* m, const float* margin,
                        const float* k_sizes, const float* q_sizes, float limit) {
  alignas(64) float thr[kWideCols];
  uint32_t chosen[chosen_room(Ops::kKeyBlock * kWideCols)];
  return near_max_thresholds<Ops>(s, lds, nb, lanes, 1.0f, nullptr, m, margin, thr) &&
         near_max_choose<Ops>(s, lds, nb, lanes, 1.0f, thr, k_sizes, q_sizes, limit, false, chosen) >= 0;
}

// The backward's screen, for a pair of tiles whose rows' lse the forward left: s holds the fp32
// scores, scaled, of `rows` query rows (rows of q at q + r·q_row, norms q_sizes) against `lanes`
// keys (rows of k at k + x·k_row, norms k_sizes), lds apart; thr[r] is row r's lse less its margin
// (near_max_margins). A score under thr weighs under e^-T beside the row's sum, as in the forward.
// The (row, key) of each score at or over thr whose norms pass `limit`, as r·kWideCols + x, into
// chosen; their count, or -1 past one score in eight or where a score is not finite.
template <class Ops>
int64_t near_lse_choose(const float* s, int64_t lds, int64_t rows, int64_t lanes, const float* thr,
                        const float* q_sizes, const float* k_sizes, float limit, uint32_t* chosen) {
  using V = typename Ops::V;
  constexpr int L = Ops::kLanes;
  const int64_t most = rows * lanes / 8;
  int64_t count = 0;
  V finite = Ops::zero();  // s·0 summed, NaN where a score is inf or NaN
  for (int64_t r = 0; r < rows; ++r) {
    const V t = Ops::set1(thr[r]);
    uint64_t bits = 0;  // a row's keys in one mask
    for (int64_t g = 0; g < lanes / L; ++g) {
      const V x = Ops::load(s + r * lds + g * L);
      finite = Ops::fma(x, Ops::zero(), finite);
      bits |= static_cast<uint64_t>(Ops::ge_mask(x, t)) << (g * L);
    }
    for (; bits != 0; bits &= bits - 1) {
      const int64_t x = std::countr_zero(bits);
      if (!refined(q_sizes[r], k_sizes[x], limit)) continue;
      if (count == most) return -1;
      chosen[count++] = static_cast<uint32_t>(r * kWideCols + x);
    }
  }
  return Ops::any_nan(finite) ? -1 : count;
}

// refine_near_max's form for the backward: the scores near_lse_choose picks summed again
// (sum_chosen), the others left in fp32 with s_lo 0. False, with nothing written, where
// near_lse_choose finds it would not pay.
template <class Ops>
bool refine_near_lse(const float* q, int64_t q_row, const float* q_sizes, const float* k, int64_t k_row,
                     const float* k_sizes, int64_t kdim, float scale, float* s, float* s_lo, int64_t lds, int64_t rows,
                     int64_t lanes, const float* thr, float limit) {
  uint32_t chosen[kWideCols * kWideCols / 8];  // rows, lanes <= kWideCols
  const int64_t count = near_lse_choose<Ops>(s, lds, rows, lanes, thr, q_sizes, k_sizes, limit, chosen);
  if (count < 0) return false;
  sum_chosen<Ops>(q, q_row, k, k_row, kdim, scale, s, s_lo, nullptr, lds, rows, chosen, count);
  return true;
}

}  // namespace
}  // namespace qkv::kernels
