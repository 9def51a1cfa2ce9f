// One task of the fused attention backward (FlashAttention-2 style), written once for every SIMD
// family: Ops is a family's vector operations (<isa>/ops.h). Included by each family's
// backward.cpp after its <isa>/ops.h, with backward.h and microkernel.h.
//
// A task owns one chunk of query rows of every query head of one kv head. Head by head, it packs
// the chunk's q and dout once, then walks the key tiles in groups of BackwardParams::key_group,
// and for each group visits the chunk's query tiles in order, each against the group's key tiles
// in order (so a query tile's q, dout and dq come from L3 once per group, not once per key tile;
// every sum still sees its terms in the order of one key tile at a time):
//   S  = scale·(q·kᵀ),  P = exp(S − lse)  (recomputed; masks through MaskEval)
//   dP = dout·vᵀ,  dS = P ∘ (dP − D)     (D = rowsum(dout ∘ out))
//   dv += Pᵀ·dout,  dk += dSᵀ·q,  dq += dS·k  (sums in scratch; dq written after each head, dk
//                                             and dv after the last head of the group)
// All five block products are the forward's micro-kernel (microkernel.h): its A operand is read
// through a row stride and a k stride, so Pᵀ and dSᵀ are just P and dS read with swapped strides,
// and "+=" is its per-row alpha set to 1. Lanes run along keys; every sum runs in a fixed order.
//
// S is computed bit for bit as the forward computes it (the same micro-kernel and order over D,
// then rounded times scale), and S − lse is taken before the scaling by log2(e), as the forward
// takes S − max: S is near lse for the keys that matter, so the subtraction is exact, P carries
// only lse's rounding (one FMA of −lse·log2e would round an exponent of ~150 at scores of ~100:
// 1e-5 in every P, which PyTorch's softmax has not) and a row that sees one key gets P = 1. Given
// lse in float64 (lse_wide), P = 2^(((S − hi) − lo)·log2e) with lse = hi + lo: no fp32 rounding.
#pragma once

#include "kernels/backward_ops.h"
#include "kernels/dropout_tile.h"
#include "kernels/large_scores_screen.h"

namespace qkv::kernels {
namespace {

template <class Ops>
class BackwardTile : BackwardOps<Ops> {
  using BackwardOps<Ops>::add_to, BackwardOps<Ops>::copy_row, BackwardOps<Ops>::transpose_tile,
      BackwardOps<Ops>::product, BackwardOps<Ops>::wide_dot, BackwardOps<Ops>::exponent_bits, BackwardOps<Ops>::slot,
      BackwardOps<Ops>::exceeds_half;
  using V = typename Ops::V;
  static constexpr int L = Ops::kLanes;
  static constexpr int64_t T = kBackwardTile;
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  static_assert(T % L == 0);

 public:
  BackwardTile(const BackwardParams& p, const BackwardTask& t, float* scratch)
      : p_(p), s_(p.shape), mask_(*p.mask), b_(t.b), hk_(t.hk), chunk_(t.chunk), group_(p.shape.H / p.shape.Hkv) {
    r0_ = chunk_ * p.chunk_rows;
    r1_ = std::min(s_.N, r0_ + p.chunk_rows);
    dp_ = (s_.D + L - 1) / L * L;
    dvp_ = (s_.Dv + L - 1) / L * L;
    elementwise_ = mask_.has_elementwise();
    cap_ = mask_.mask().softcap;
    const BackwardLayout lay(p);
    q_ = scratch + lay.q, dout_ = scratch + lay.dout, dq_ = scratch + lay.dq, row_dot_ = scratch + lay.row_dot;
    q_sizes_ = scratch + lay.q_sizes, k_sizes_ = scratch + lay.k_sizes;
    dominant_ = reinterpret_cast<int64_t*>(scratch + lay.dominant), dominant_cap_ = scratch + lay.dominant_cap;
    others_ = reinterpret_cast<double*>(scratch + lay.others);
    row_dot_wide_ = reinterpret_cast<double*>(scratch + lay.row_dot_wide);
    margin_ = scratch + lay.margin, separates_ = reinterpret_cast<int8_t*>(scratch + lay.separates);
    kt_ = scratch + lay.kt, vt_ = scratch + lay.vt, k_ = scratch + lay.k, dk_ = scratch + lay.dk,
    dv_ = scratch + lay.dv;
    dk_head_ = scratch + lay.dk_head, dv_head_ = scratch + lay.dv_head;
    st_ = scratch + lay.s_, ds_ = scratch + lay.ds, dcap_ = scratch + lay.dcap;
    ones_ = scratch + lay.ones, iota_ = scratch + lay.iota;
    wide_ = reinterpret_cast<double*>(scratch + lay.wide);
    slo_ = scratch + lay.s_lo;
    renorm_ = reinterpret_cast<int8_t*>(scratch + lay.renorm), norm_max_ = scratch + lay.norm_max;
    norm_log_ = reinterpret_cast<double*>(scratch + lay.norm_log);
    renorm_above_ = p.lse_wide != nullptr ? kRenormWide : kRenormFloat;
    for (int64_t c = 0; c < T; ++c) ones_[c] = 1.0f, iota_[c] = static_cast<float>(c);
    zeros_ = scratch + lay.zeros;
    std::fill(zeros_, zeros_ + std::max(dp_, dvp_), 0.0f);
  }

  void run() {
    seen_ = p_.key_extents[b_];
    ordered_ = detail::bands_ordered(p_.bands + b_ * s_.N + r0_, r1_ - r0_);
    k_bound_ = seen_.empty() ? 0.0f
                             : max_row_norm(p_.kf() + p_.k_stride.at(b_, hk_, seen_.lo), p_.k_stride.row,
                                            p_.k_stride.col, seen_.hi - seen_.lo, s_.D);
    k_sizes_ready_ = false;
    keys_ = p_.chunk_keys[chunk_ * s_.B + b_];
    const int64_t sums = keys_.hi - keys_.lo;  // rows of dk_, dv_ (and dk_head_, dv_head_)
    std::fill(dk_, dk_ + sums * dp_, 0.0f);
    std::fill(dv_, dv_ + sums * dvp_, 0.0f);
    for (int64_t g = 0; g < group_; ++g) {
      const int64_t h = hk_ * group_ + g;
      // The first head sums straight into the group's dk, dv; the others into their own.
      dk_sum_ = g == 0 ? dk_ : dk_head_;
      dv_sum_ = g == 0 ? dv_ : dv_head_;
      if (g > 0) {
        std::fill(dk_head_, dk_head_ + sums * dp_, 0.0f);
        std::fill(dv_head_, dv_head_ + sums * dvp_, 0.0f);
      }
      pack_chunk(h);
      if (renorm_any_) renormalize(h);
      first_row_ = r0_;
      for (int64_t j0 = first_group(); j0 < keys_.hi; j0 += span()) {
        if (stop_requested(p_.interrupt)) return;
        key_group(h, j0, std::min(span(), seen_.hi - j0));
      }
      if (defer_) settle_dominant_keys(h);
      write_dq(h);
      if (g > 0) {
        add_to(dk_, dk_head_, sums * dp_);
        add_to(dv_, dv_head_, sums * dvp_);
      }
    }
    write_key_sums();
    report_nonfinite();
  }

 private:
  // q, dout of the chunk's rows of head h packed with zero padding to dp/dvp (a dead row, whose
  // q, dout and out are never read, as zeros); D per row; dq sums zeroed.
  void pack_chunk(int64_t h) {
    for (int64_t i = r0_; i < r1_; ++i) {
      const int64_t row = i - r0_;
      const bool read = live(h, i);  // copies of width 0: rows of zeros
      copy_row(q_ + row * dp_, p_.qf() + p_.q_stride.at(b_, h, i), p_.q_stride.col, read ? s_.D : 0, dp_);
      copy_row(dout_ + row * dvp_, p_.dout + p_.dout_stride.at(b_, h, i), p_.dout_stride.col, read ? s_.Dv : 0, dvp_);
      std::fill(dq_ + row * dp_, dq_ + (row + 1) * dp_, 0.0f);
    }
    sizes_for_refining();
    row_dots(h);
    if (refine_) wide_row_dots(h);
    renorm_any_ = false;
    for (int64_t i = r0_; i < r1_; ++i) {
      const int64_t row = i - r0_;
      const double lse = row_lse(h, i);
      const bool read = live(h, i);
      if (!read) row_dot_[row] = 0.0f, row_dot_wide_[row] = 0.0;
      // Renormalized (a row of the whole) where lse's own rounding would pass into every P.
      renorm_[row] = p_.whole_rows && read && std::isfinite(lse) && std::abs(lse) > renorm_above_;
      renorm_any_ |= renorm_[row] != 0;
    }
    defer_ = refine_ && p_.whole_rows;
    if (defer_) {
      std::fill(dominant_, dominant_ + (r1_ - r0_), int64_t{-1});
      std::fill(others_, others_ + (r1_ - r0_), 0.0);
    }
  }

  // large_scores.h's norms for the head's chunk: fp32 bounds over all its rows and keys first
  // (ordinary inputs stop there), then |q| of each row and, once per task, |k| of each key.
  void sizes_for_refining() {
    const int64_t rows = r1_ - r0_;
    refine_ = max_row_norm(q_, dp_, 1, rows, s_.D) * k_bound_ > large_gate_limit(p_.scale, s_.D);
    if (!refine_) return;
    for (int64_t r = 0; r < rows; ++r) q_sizes_[r] = l2_norm(q_ + r * dp_, 1, s_.D);
    near_max_margins(q_sizes_, rows, k_bound_, p_.scale, s_.D, s_.M, margin_);
    std::fill(separates_, separates_ + (rows + T - 1) / T, int8_t{0});
    if (k_sizes_ready_) return;
    for (int64_t j = keys_.lo; j < keys_.hi; ++j)  // a key no row reads has no size
      k_sizes_[j] =
          j >= seen_.lo && j < seen_.hi ? l2_norm(p_.kf() + p_.k_stride.at(b_, hk_, j), p_.k_stride.col, s_.D) : 0.0f;
    k_sizes_ready_ = true;
  }

  // D = rowsum(dout ∘ out) in the very operations and order of the micro-kernel's dP = dout·vᵀ
  // (one fused multiply-add per term on every family): where a row sees a
  // single key, out is that key's v and dP − D must cancel to exactly 0, as the exact gradient
  // does. Each row's chain stays serial (its order is its bits); kRows rows run side by side
  // because one chain alone waits on the FMA latency at every term (9% of S2's backward).
  void row_dots(int64_t h) {
    constexpr int kRows = 8;
    for (int64_t i = r0_; i < r1_; i += kRows) {
      const int64_t n = std::min<int64_t>(kRows, r1_ - i);
      const float* out[kRows];
      const float* dop[kRows];
      float dot[kRows];
      for (int r = 0; r < kRows; ++r) {  // rows past the chunk repeat its first row, unused
        const int64_t row = r < n ? i + r : i;
        out[r] = p_.out + p_.out_stride.at(b_, h, row);
        dop[r] = dout_ + (row - r0_) * dvp_;
        dot[r] = 0.0f;
      }
      for (int64_t e = 0; e < s_.Dv; ++e)
        for (int r = 0; r < kRows; ++r) {
          if constexpr (L == 1)
            dot[r] = Ops::fma(dop[r][e], out[r][e * p_.out_stride.col], dot[r]);
          else
            dot[r] = std::fma(dop[r][e], out[r][e * p_.out_stride.col], dot[r]);
        }
      for (int64_t r = 0; r < n; ++r) row_dot_[i - r0_ + r] = dot[r];
    }
  }

  // D of each chunk row in double, for heavy_keys.
  void wide_row_dots(int64_t h) {
    for (int64_t i = r0_; i < r1_; ++i)
      row_dot_wide_[i - r0_] =
          wide_dot(dout_ + (i - r0_) * dvp_, p_.out + p_.out_stride.at(b_, h, i), p_.out_stride.col, s_.Dv);
  }

  // The gradients' way out (backward_writes.h).
  void scale_row(float* dst, int64_t stride, const float* src, float scale, int64_t width);
  void report_nonfinite() const;
  void write_key_sums();
  void write_dq(int64_t h);

  // The first key of the first group of keys that holds keys of keys_: groups of span() keys lie
  // from key 0 in every chunk, and the last one ends at seen_.hi.
  int64_t first_group() const { return keys_.lo / span() * span(); }
  int64_t span() const { return T * p_.key_group; }

  // Keys [j0, j0 + keys): packs them (pack_keys), then visits the chunk's query tiles of head h,
  // each against the group's key tiles in order. With ordered_ bands only the tiles whose rows may
  // see these keys: the rows before first_row_ see none of them nor of the later groups.
  void key_group(int64_t h, int64_t j0, int64_t keys) {
    pack_keys(j0, keys);
    while (ordered_ && first_row_ < r1_ && p_.bands[b_ * s_.N + first_row_].hi <= j0) ++first_row_;
    for (int64_t i0 = r0_ + (first_row_ - r0_) / T * T; i0 < r1_; i0 += T) {
      const detail::KeyBand& first = p_.bands[b_ * s_.N + i0];
      if (ordered_ && !first.empty() && first.lo >= j0 + keys) break;  // and every row after it
      tile_rows(h, i0, std::min(T, r1_ - i0));
      for (int64_t t = 0; t * T < keys; ++t)
        pair(h, i0, std::min(T, r1_ - i0), j0 + t * T, std::min(T, keys - t * T), t);
    }
  }

  // kᵀ, vᵀ and k of each key tile of keys [j0, j0 + keys) (tile t in slot t).
  void pack_keys(int64_t j0, int64_t keys) {
    for (int64_t t = 0; t * T < keys; ++t) {
      const int64_t jt = j0 + t * T, cols = std::min(T, keys - t * T);
      float* kr = slot(k_, t, dp_);
      const float* k = p_.kf() + p_.k_stride.at(b_, hk_, jt);
      const float* v = p_.vf() + p_.v_stride.at(b_, hk_, jt);
      // Keys before any row's band (the run ends at the last one's) are zeros: never read.
      const int64_t unseen = std::clamp<int64_t>(seen_.lo - jt, 0, cols);
      for (int64_t c = 0; c < cols; ++c)
        copy_row(kr + c * dp_, k + c * p_.k_stride.row, p_.k_stride.col, c < unseen ? 0 : s_.D, dp_);
      transpose_tile(slot(kt_, t, dp_), kr, dp_, 1, s_.D, cols);  // kᵀ from the packed rows, which sit in L1
      float* vt = slot(vt_, t, dvp_);
      transpose_tile(vt, v, p_.v_stride.row, p_.v_stride.col, s_.Dv, cols);
      for (int64_t e = 0; unseen > 0 && e < s_.Dv; ++e) std::fill(vt + e * T, vt + e * T + unseen, 0.0f);
    }
  }

  // What the rows of query tile [i0, i0 + rows) of head h keep for every key tile: the band, lse
  // and whether the row sees a single key. A row with lse = -inf had no allowed key in the
  // forward: it is treated as dead, with no band.
  void tile_rows(int64_t h, int64_t i0, int64_t rows) {
    renorm_tile_ = false;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      const detail::KeyBand& band = p_.bands[b_ * s_.N + i];
      const double lse = row_lse(h, i);
      const bool live = this->live(h, i);
      band_lo_[r] = live ? band.lo : 0, band_hi_[r] = live ? band.hi : 0;
      // lse as hi + lo floats (lo = 0 for an fp32 lse): S − hi is exact for the keys that matter,
      // then − lo restores lse's bits below fp32 (dead rows: every logit is -inf, so P = 0).
      lse_[r] = live ? static_cast<float>(lse) : 0.0f;
      lse_lo_[r] = live ? static_cast<float>(lse - static_cast<double>(lse_[r])) : 0.0f;
      if (renorm_any_ && renorm_[i - r0_]) {  // renormalize's max and log of the sum instead
        renorm_tile_ = true;
        lse_[r] = norm_max_[i - r0_];
        lse_lo_[r] = static_cast<float>(norm_log_[i - r0_]);
      }
      // A softmax over one key is the constant 1: its logit's gradient is exactly 0, which the
      // rounding of out and lse would otherwise leave as noise in dq and dk.
      single_[r] = p_.whole_rows && live && band.hi - band.lo == 1;
    }
  }

  // Per-row bands of the query tile of tile_rows against keys [j0, j0 + cols); returns false if
  // no row sees any of them.
  bool tile_bands(int64_t rows, int64_t j0, int64_t cols) {
    bool any = false;
    interior_ = true;
    for (int64_t r = 0; r < rows; ++r) {
      lo_[r] = std::clamp<int64_t>(band_lo_[r] - j0, -1, T + 1);
      hi_[r] = std::clamp<int64_t>(band_hi_[r] - j0, -1, cols);
      any |= lo_[r] < hi_[r];
      interior_ &= lo_[r] <= 0 && hi_[r] >= T;
    }
    return any;
  }

  double row_lse(int64_t h, int64_t i) const {
    const int64_t at = p_.lse_stride.at(b_, h, i);
    return p_.lse_wide != nullptr ? p_.lse_wide[at] : p_.lse[at];
  }
  // Whether row i of head h read a key in the forward: a band, and lse not -inf (every key masked).
  bool live(int64_t h, int64_t i) const {
    return !p_.bands[b_ * s_.N + i].empty() && row_lse(h, i) != -std::numeric_limits<double>::infinity();
  }

  // Query tile [i0, i0 + rows) against key tile [j0, j0 + cols), packed in slot t of the group.
  // noinline and scores always_inline: the layout GCC gave the pair when it was one function
  // (inlined into the key loop and calling scores, it ran 2-3% slower on S2-S4).
  __attribute__((noinline)) void pair(int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols, int64_t t) {
    if (!tile_bands(rows, j0, cols)) return;
    scores(h, i0, rows, j0, cols, t);
    const float* vt = slot(vt_, t, dvp_);
    const float* kr = slot(k_, t, dp_);
    const int64_t row = i0 - r0_;
    tile_row0_ = row;
    float* dk = key_sums(dk_sum_, j0, dp_);
    float* dv = key_sums(dv_sum_, j0, dvp_);
    const float* qp = q_ + row * dp_;
    const float* dop = dout_ + row * dvp_;
    // ds = dout · vᵀ: [rows, Dv] · [Dv, T]
    product(ds_, T, dop, dvp_, 1, vt, T, nullptr, s_.Dv, rows, T);
    if (p_.dropout.active()) drop_grads(h, i0, rows, j0, cols);
    logit_grads(row, h, i0, rows, j0, cols);
    if (p_.dropout.active()) drop_weights(rows);
    // dv += Pᵀ · dout: [cols, rows] · [rows, Dv]
    product(dv, dvp_, st_, 1, T, dop, dvp_, ones_, rows, cols, dvp_);
    // dk += dSᵀ · q: [cols, rows] · [rows, D]
    product(dk, dp_, ds_, 1, T, qp, dp_, ones_, rows, cols, dp_);
    // dq += dS · k: [rows, cols] · [cols, D]
    product(dq_ + row * dp_, dp_, ds_, T, 1, kr, dp_, ones_, cols, rows, dp_);
  }

  // st = the logits of query tile [i0, i0 + rows) against key tile t ([j0, j0 + cols)) after
  // tile_bands: scale·(q·kᵀ), refined where large, through the elementwise masks (logits).
  __attribute__((always_inline)) void scores(int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols, int64_t t) {
    const float* kt = slot(kt_, t, dp_);
    const float* kr = slot(k_, t, dp_);
    const int64_t row = i0 - r0_;
    const float* qp = q_ + row * dp_;
    // st = q · kᵀ: [rows, D] · [D, T], the fp32 product skipped when every score is summed again
    // densely; the screen (near_lse) needs it. A query tile takes the screen once a pair summed the
    // dense way showed that its scores separate (q·4's and q·8's do not: they would pay it for
    // nothing), or from its first pair where the chunk's tile before it did. A tile with a
    // renormalized row is summed the dense way in both passes, so its scores have the same bits.
    const Refine extent =
        refine_ ? refine_extent(q_sizes_ + row, rows, k_sizes_ + j0, cols, large_score_limit(p_.scale)) : Refine::none;
    const bool may_screen = extent != Refine::none && !elementwise_ && interior_ && !renorm_tile_;
    int8_t& separates = separates_[row / T];  // set for the head only when refine_, as may_screen needs
    if (may_screen && separates == 0 && row >= T && separates_[row / T - 1] > 0) separates = 1;
    const bool screen = may_screen && separates > 0;
    // The scale is a rounding of its own, as in the forward: never fused with lse. Where nothing
    // reads the scores before their weights (renormalize() reads their max), probabilities()
    // applies it as it loads them.
    scale_pending_ = extent == Refine::none && !elementwise_ && !renorm_tile_;
    if (extent != Refine::every || screen) {
      product(st_, T, qp, dp_, 1, kt, T, nullptr, s_.D, rows, T);
      if (!scale_pending_) {
        const V scale = Ops::set1(p_.scale);
        for (int64_t x = 0; x < rows * T; x += L) Ops::store(st_ + x, Ops::mul(Ops::load(st_ + x), scale));
      }
    }
    lo_pair_ = extent != Refine::none;  // then slo_ holds the refined scores' low parts
    if (lo_pair_ && !(screen && near_lse(row, rows, j0, qp, kr))) {
      refine_large(row, rows, j0, cols, qp, kt, extent == Refine::every);
      if (may_screen && separates == 0)  // decided once per query tile
        separates = near_lse(row, rows, j0, nullptr, nullptr) ? 1 : -1;
      else if (screen)
        separates = -1;  // a pair it did not separate: the tile sums the dense way
    }
    if (elementwise_) logits(h, i0, rows, j0);
  }

  // The scores of large |q|·|k| summed again and scaled in double (written scaled), as the forward
  // does (large_scores.h): row r of st is query row `row` + r against kᵀ; their low parts go to slo_.
  void refine_large(int64_t row, int64_t rows, int64_t j0, int64_t cols, const float* qp, const float* kt, bool every) {
    for (int64_t c = 0; c < T; ++c) ka_[c] = c < cols ? k_sizes_[j0 + c] : 0.0f;
    refine_scores<Ops>(qp, dp_, 1, q_sizes_ + row, kt, T, ka_.data(), s_.D, p_.scale, st_, slo_, T, rows, T,
                       large_score_limit(p_.scale), every, wide_);
  }

  // The pair's scores summed again only near each row's lse (refine_near_lse), or without q and k
  // (after the dense sums) whether refine_near_lse would have taken them.
  bool near_lse(int64_t row, int64_t rows, int64_t j0, const float* qp, const float* kr) {
    alignas(64) float thr[T];
    for (int64_t r = 0; r < rows; ++r) thr[r] = lse_[r] - margin_[row + r];
    const float limit = large_score_limit(p_.scale);
    uint32_t chosen[T * T / 8];
    if (qp == nullptr)
      return near_lse_choose<Ops>(st_, T, rows, T, thr, q_sizes_ + row, k_sizes_ + j0, limit, chosen) >= 0;
    return refine_near_lse<Ops>(qp, dp_, q_sizes_ + row, kr, dp_, k_sizes_ + j0, s_.D, p_.scale, st_, slo_, T, rows, T,
                                thr, limit);
  }

  // Dropout (qkv/dropout.h) with out = (P ∘ Z / (1 − p)) · v for the keep-mask Z: the gradient
  // of the dropped weights dP·Z / (1 − p) replaces dP (ds: dout·vᵀ) before dS = P ∘ (dP − D), whose
  // D = rowsum(dout ∘ out) already is Σ P·Z·dP / (1 − p). The tile's mask is kept for drop_weights.
  void drop_grads(int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
    const float scale = p_.dropout_scale;
    for_each_kept(p_.dropout, s_.H, b_, h, i0, rows, j0, cols, [&](int64_t r, int64_t c, bool kept) {
      keep_[r * T + c] = kept;
      ds_[r * T + c] = kept ? ds_[r * T + c] * scale : 0.0f;
    });
  }

  // dv's weights: P (st) becomes P ∘ Z / (1 − p), the weights the forward multiplied v by.
  void drop_weights(int64_t rows) {
    const float scale = p_.dropout_scale;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < T; ++c) st_[r * T + c] = keep_[r * T + c] ? st_[r * T + c] * scale : 0.0f;
  }

  // st: scale·(q·kᵀ) on entry, the logits on exit (-inf outside the band). Keep-mask, bias, ALiBi
  // and softcap go through MaskEval::adjust itself, in band only. The refined scores go through
  // the elementwise terms with their low parts (adjust_refined), as in the forward. Softcap alone
  // and its derivative take the row at once (softcap.h, or with refined scores
  // softcap_refined_run: the forward's bits).
  void logits(int64_t h, int64_t i0, int64_t rows, int64_t j0) {
    const float limit = large_score_limit(p_.scale);
    const bool terms = mask_.has_terms_after_softcap();
    for (int64_t r = 0; r < rows; ++r) {
      float* st = st_ + r * T;
      float* slo = slo_ + r * T;
      float* dcap = dcap_ + r * T;
      const float q_size = lo_pair_ ? q_sizes_[i0 - r0_ + r] : 0.0f;
      const bool row_cap = cap_ > 0 && (!lo_pair_ || !terms);
      if (row_cap && lo_pair_)
        softcap_refined_run(st, slo, dcap, ka_.data(), q_size, limit, T, cap_);
      else if (row_cap)
        detail::softcap_scores(st, dcap, T, cap_);
      for (int64_t c = 0; c < T; ++c) {
        if (c < lo_[r] || c >= hi_[r]) {
          st[c] = kNegInf;
          dcap[c] = 1.0f;
        } else if (row_cap) {
          if (terms) st[c] = mask_.add_terms(st[c], b_, h, i0 + r, j0 + c);
        } else if (lo_pair_ && refined(q_size, ka_[c], limit)) {
          adjust_refined(mask_, st[c], slo[c], b_, h, i0 + r, j0 + c, dcap + c);
        } else {
          if (cap_ > 0) dcap[c] = detail::softcap_slope(st[c], cap_);
          st[c] = mask_.adjust(st[c], b_, h, i0 + r, j0 + c);
        }
      }
    }
  }

  // P = exp(logit − lse) of each vector of st's rows (the logits: scale·(q·kᵀ) without
  // elementwise masks), 0 outside the band (and past the keys), given to f(r, c, P).
  template <class F>
  __attribute__((always_inline)) void for_each_weight(int64_t rows, F&& f) {
    const V log2e = Ops::set1(kLog2e), scale = Ops::set1(scale_pending_ ? p_.scale : 1.0f);  // 1: exact
    const bool banded = !elementwise_ && !interior_, lo_pair = lo_pair_;
    const float* const st0 = st_;
    const float* const slo0 = slo_;
    for (int64_t r = 0; r < rows; ++r) {
      const float* st = st0 + r * T;
      const V lse = Ops::set1(lse_[r]), lse_lo = Ops::set1(lse_lo_[r]);
      const V lo = Ops::set1(static_cast<float>(lo_[r])), hi = Ops::set1(static_cast<float>(hi_[r]));
      const float* slo = slo0 + r * T;
      for (int64_t c = 0; c < T; c += L) {
        V arg = Ops::sub(Ops::mul(Ops::load(st + c), scale), lse);
        if (lo_pair) arg = Ops::add(arg, Ops::load(slo + c));  // the score's low part, as the forward
        V x = Ops::mul(Ops::sub(arg, lse_lo), log2e);
        if (banded) x = Ops::band_mask(x, Ops::load(iota_ + c), lo, hi);
        f(r, c, Ops::exp2(x));
      }
    }
  }

  // st: the logits on entry, P on exit (for_each_weight). The callers' buffers are locals: each
  // vector store may alias the members, which were reloaded at every one.
  void probabilities(int64_t rows) {
    float* const st = st_;
    for_each_weight(rows, [st](int64_t r, int64_t c, V pv) { Ops::store(st + r * T + c, pv); });
  }

  // st: the logits on entry, P on exit, as probabilities() leaves them; ds: dout·vᵀ on entry,
  // dL/d(scaled score) on exit: dS = P ∘ (dP − D), written to dbias (= dL/dlogit) when asked,
  // then times softcap's derivative. P and dS in one pass, while P is in registers.
  void logit_grads(int64_t row, int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
    V pmax = Ops::zero();
    float* const st = st_;
    float* const ds = ds_;
    const float* const dots = row_dot_ + row;
    for_each_weight(rows, [&pmax, st, ds, dots](int64_t r, int64_t c, V pv) {
      Ops::store(st + r * T + c, pv);
      pmax = Ops::max(pmax, pv);
      float* d = ds + r * T + c;
      Ops::store(d, Ops::mul(pv, Ops::sub(Ops::load(d), Ops::set1(dots[r]))));
    });
    // Each row's largest P, when a row may hold a heavy or dominant key (rare unless the softmax is
    // near one-hot or q is large).
    const bool any_dominant = exceeds_half(pmax);
    if (refine_ || any_dominant)
      for (int64_t r = 0; r < rows; ++r) {
        V m = Ops::zero();
        for (int64_t c = 0; c < T; c += L) m = Ops::max(m, Ops::load(st_ + r * T + c));
        alignas(64) float lanes[L];
        Ops::store(lanes, m);
        row_pmax_[r] = *std::max_element(lanes, lanes + L);
      }
    if (refine_) heavy_keys(row, rows, j0, cols);
    if (defer_)
      defer_dominant_keys(row, rows, j0, cols);
    else if (any_dominant)
      for (int64_t r = 0; r < rows; ++r)
        if (row_pmax_[r] > 0.5f) dominant_key(row + r, h, i0 + r, j0, cols, st_ + r * T, ds_ + r * T);
    for (int64_t r = 0; r < rows; ++r)
      if (single_[r]) std::fill(ds_ + r * T, ds_ + (r + 1) * T, 0.0f);
    if (p_.dbias != nullptr)
      for (int64_t r = 0; r < rows; ++r) {
        float* out = p_.dbias + p_.dbias_stride.at(b_, h, i0 + r) + j0 * p_.dbias_stride.col;
        uint32_t worst = 0;
        for (int64_t c = 0; c < cols; ++c)
          out[c * p_.dbias_stride.col] = ds_[r * T + c], worst = std::max(worst, exponent_bits(ds_[r * T + c]));
        worst_ = std::max(worst_, worst);
      }
    if (elementwise_ && cap_ > 0)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < T; c += L)
          Ops::store(ds_ + r * T + c, Ops::mul(Ops::load(ds_ + r * T + c), Ops::load(dcap_ + r * T + c)));
  }

  // A whole row's max and normalizer when its lse cannot carry them (backward_renorm.h).
  void renormalize(int64_t h);
  // The keys that large q or a near-one-hot row make heavy or dominant (backward_dominant.h).
  void heavy_keys(int64_t row, int64_t rows, int64_t j0, int64_t cols);
  void defer_dominant_keys(int64_t row, int64_t rows, int64_t j0, int64_t cols);
  void settle_dominant_keys(int64_t h);
  void dominant_key(int64_t row, int64_t h, int64_t i, int64_t j0, int64_t cols, const float* pr, float* ds);

  // Key j's row of sums (dk_, dv_, dk_head_, dv_head_: one row per key of keys_, from its first).
  float* key_sums(float* sums, int64_t j, int64_t width) const { return sums + (j - keys_.lo) * width; }

  const BackwardParams& p_;
  const AttentionShape& s_;
  const detail::MaskEval& mask_;
  int64_t b_, hk_, chunk_, group_;
  int64_t r0_ = 0, r1_ = 0, dp_ = 0, dvp_ = 0;
  bool ordered_ = false;   // the chunk's bands are detail::bands_ordered
  int64_t first_row_ = 0;  // with ordered_, no row before it sees the current key group
  bool elementwise_ = false, interior_ = false;
  bool scale_pending_ = false;  // st_ holds the pair's products unscaled (scores(), probabilities())
  uint32_t worst_ = 0;          // the largest exponent field of a gradient written (exponent_bits)
  bool refine_ = false;         // whether a score of the head's chunk may pass large_scores.h's bound
  bool k_sizes_ready_ = false;  // k_sizes_ holds this task's |k| of each key
  float k_bound_ = 0.0f;        // an upper bound of |k| over the keys of seen_
  // Per chunk row of the head: whether renormalize takes it, and its logits' max and the log of
  // Σ exp(logit − max) from there (running sum while it runs). renorm_tile_: the current tile has one.
  int8_t* renorm_;
  float* norm_max_;
  double* norm_log_;
  bool renorm_any_ = false, renorm_tile_ = false;
  double renorm_above_;   // |lse| past which a row is renormalized, by lse's type
  detail::KeyBand seen_;  // the keys some row of the batch row reads (key_extents)
  detail::KeyBand keys_;  // the key tiles this chunk's rows may see (chunk_keys): its sums' rows
  float* zeros_;          // a row of zeros, chunk 0's sums of the keys past keys_
  float cap_ = 0.0f;
  float *q_, *dout_, *dq_, *row_dot_, *q_sizes_, *k_sizes_, *kt_, *vt_, *k_, *dk_, *dv_, *st_, *ds_, *dcap_, *ones_,
      *iota_;
  float *dk_head_, *dv_head_, *dk_sum_ = nullptr, *dv_sum_ = nullptr;  // dk_sum_, dv_sum_: the current head's
  // Per row of the current query tile (tile_rows): its band of keys (empty for a dead row); then
  // the band relative to the current key tile's j0 (clamped, tile_bands: empty when lo >= hi),
  // and its lse.
  std::array<int64_t, T> band_lo_{}, band_hi_{}, lo_{}, hi_{};
  std::array<float, T> lse_{}, lse_lo_{};
  std::array<float, T> ka_{};        // |k| of the current key tile's keys (0 past them), for refine_large
  double* wide_;                     // refine_large's kᵀ and q rows in double (refine_room(D))
  float* slo_;                       // the scores' low parts, T·T, when lo_pair_
  bool lo_pair_ = false;             // whether slo_ holds the current pair's
  bool defer_ = false;               // whether dominant keys wait for the whole row (defer_dominant_keys)
  int64_t* dominant_;                // per chunk row: its dominant key, or -1
  float* dominant_cap_;              // softcap's derivative at that key (1 without softcap)
  double* others_;                   // the sum of the row's other keys' dS
  double* row_dot_wide_;             // per chunk row: D in double (wide_row_dots), when refine_
  float* margin_;                    // per chunk row: near_max_margins', when refine_
  int8_t* separates_;                // per query tile of the chunk: whether its scores separate (near_lse)
  std::array<float, T> row_pmax_{};  // the largest P of each row of the pair (logit_grads)
  static_assert(T == kWideCols);
  std::array<bool, T> single_{};
  std::array<bool, T * T> keep_{};  // the current pair's dropout keep-mask (drop_grads), [rows x T]
  int64_t tile_row0_ = 0;           // the chunk row of the current pair's first row
  int64_t row_in_tile(int64_t chunk_row) const { return chunk_row - tile_row0_; }
};

}  // namespace
}  // namespace qkv::kernels

#include "kernels/backward_dominant.h"
#include "kernels/backward_renorm.h"
#include "kernels/backward_writes.h"

namespace qkv::kernels {
namespace {

template <class Ops>
void backward_tile(const BackwardParams& p, const BackwardTask& task, float* scratch) {
  BackwardTile<Ops>(p, task, scratch).run();
}

}  // namespace
}  // namespace qkv::kernels
