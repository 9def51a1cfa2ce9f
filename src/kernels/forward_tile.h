// One tile of the fused forward kernel (FlashAttention-2 style), written once for every SIMD
// family: Ops is a family's vector operations (<isa>/ops.h). Include after a family's <isa>/ops.h
// and microkernel.h; tile_group.h runs a task's tiles.
//
// The scores of a key block are computed transposed, Sᵀ [keys x queries], so that each vector
// lane is one query row: the row max, the exponentials and the row sums are then plain vertical
// vector operations, and both block products fit the one micro-kernel (microkernel.h):
//   Sᵀ = scale·(K · Qᵀ)   (A = rows of K read in place through their strides, B = packed Qᵀ)
//   O  = alpha ⊙ O + P · V (A = Pᵀ read transposed,                          B = rows of V)
// Softmax runs in base 2 with the running max m kept in natural units: p = 2^((s − m)·log2e).
//
// Inputs are fp32 or bf16 (In). bf16 inputs are widened to fp32 block by block, except that with
// Pairs (AVX512_BF16) both products run on bf16 pairs with vdpbf16ps (fp32 sums): S = Q·Kᵀ on the
// inputs as given, and P·V with P rounded to bf16 (2^-9 relative), which keeps the bf16 path
// within FlashAttention's rule for low precision (attention.h): PyTorch's bf16 composite rounds
// the scores, P and out to bf16 as well. Where the CPU has AMX-BF16 tiles (ForwardParams::bf16_amx)
// both products run on them instead, and O is held transposed (Oᵀ = Vᵀ · Pᵀ, forward_values.h), so
// that P's pairs go from the exponentials to the tile product as they are.
#pragma once

#include "kernels/dropout_tile.h"
#include "kernels/forward_pairs.h"
#include "kernels/large_scores_screen.h"
#include "kernels/microkernel.h"
#include "kernels/row_log.h"
#include "kernels/softmax_columns.h"
#include "kernels/transpose_blocks.h"
#include "kernels/value_block.h"

namespace qkv::kernels {
namespace {

// q: [B,H,N,D], k: [B,Hkv,M,D], v: [B,Hkv,M,Dv] -> out: [B,H,N,Dv], lse: [B,H,N], for the rows
// [i0, i0 + tile_rows) of one (b, h). A tile is sub-tile `sub` of a group of `group` tiles that
// run block by block together (forward_group, tile_group.h); its per-tile buffers are slices of the
// workspace, so all the group's tiles ask for the same slot sizes and none reallocates another's.
template <class Ops, class In, bool Pairs>
class ForwardTile {
  using V = typename Ops::V;
  static constexpr int L = Ops::kLanes;
  // What S = Q·Kᵀ multiplies: floats, or bf16 pairs (one uint32_t holds two).
  using Elem = std::conditional_t<Pairs, uint32_t, float>;

 public:
  // k_bound: an upper bound of |k| over the whole kv head (key_norm_bound in tile_group.h; 0 with
  // Pairs).
  ForwardTile(const ForwardParams& p, const ForwardTask& t, int64_t sub, Workspace& ws, PackedBlock* packed,
              float k_bound)
      : p_(p),
        packed_(packed),
        k_bound_(k_bound),
        s_(p.shape),
        mask_(*p.mask),
        b_(t.b),
        h_(t.h),
        hk_(t.h / (p.shape.H / p.shape.Hkv)),
        i0_(t.i0 + sub * p.tile_rows),
        kb_(Pairs ? Ops::kKeyBlock : fp32_block_keys<Ops>(p.key_block)) {
    q_ = ForwardParams::typed<In>(p.q) + p.q_stride.at(b_, h_, 0);
    k_ = ForwardParams::typed<In>(p.k) + p.k_stride.at(b_, hk_, 0);
    v_ = ForwardParams::typed<In>(p.v) + p.v_stride.at(b_, hk_, 0);
    bq_ = p.tile_rows;
    ls_ = column_read_stride(bq_);
    rows_ = std::min(bq_, s_.N - i0_);
    qvecs_ = (rows_ + L - 1) / L;
    dvp_ = (s_.Dv + L - 1) / L * L;
    dk_ = Pairs ? (s_.D + 1) / 2 : s_.D;
    // Rows of K and V are used in place when their layout already is what the products read.
    if constexpr (Pairs)
      k_direct_ = p.k_stride.col == 1 && s_.D % 2 == 0 && p.k_stride.row % 2 == 0;
    else
      k_direct_ = std::is_same_v<In, float>;
    // V's rows only when aligned to the family's vectors too, as P·V loads whole vectors of them:
    // a misaligned AVX-512 load spans two cache lines, which cost an Intel Xeon's P·V more than the
    // copy into the aligned workspace (shared by the group's tiles) does: S6 8-10% at one and two
    // threads, S3 and S4 2-4%.
    v_direct_ = std::is_same_v<In, float> && p.v_stride.col == 1 && dvp_ == s_.Dv &&
                vectors_aligned(v_, p.v_stride.row * static_cast<int64_t>(sizeof(In)), L * sizeof(float));
    const int64_t group = p.tile_group;
    qt_ = ws.get<Elem>(forward_slot::q_t, static_cast<std::size_t>(group * dk_ * bq_)) + sub * dk_ * bq_;
    st_ = ws.get<float>(forward_slot::scores, static_cast<std::size_t>(kb_ * ls_));
    // O [bq x dvp], or with AMX Oᵀ [dvp x bq] (accumulate_pairs)
    o_ = ws.get<float>(forward_slot::out, static_cast<std::size_t>(group * bq_ * dvp_)) + sub * bq_ * dvp_;
    static_assert(forward_slot::count <= Workspace::kSlots);
    pv_ = ws.get<float>(forward_slot::block_pv, static_cast<std::size_t>(bq_ * dvp_));
    // P·V on bf16 pairs only from one full vector of outputs per row: with Dv < L (Dv = 1, 3 in
    // the tests) a row's few outputs left P's rounding no room to average out, and it exceeded
    // FlashAttention's rule against PyTorch's bf16 composite in ~1 case in 2,000; that product
    // costs next to nothing there anyway.
    pairs_pv_ = Pairs && s_.Dv >= L;
    amx_ = Pairs && p.bf16_amx;  // then Dv >= 16 = L: pairs_pv_ too
    vpack_ =
        v_direct_ || pairs_pv_ ? nullptr : ws.get<float>(forward_slot::v_pack, static_cast<std::size_t>(kb_ * dvp_));
    if (pairs_pv_) {
      vpairs_ = ws.get<uint32_t>(forward_slot::v_pack, static_cast<std::size_t>(kb_ / 2 * dvp_));
      ppairs_ = ws.get<uint32_t>(forward_slot::p_pairs, static_cast<std::size_t>(kb_ / 2 * bq_));
    }
    if (amx_) vrows_ = ws.get<uint32_t>(forward_slot::v_rows, static_cast<std::size_t>(kb_ / 2 * dvp_));
    // AMX reads K in rows of 16: a block of fewer keys is packed with zero rows after it.
    kpack_ = k_direct_ && !amx_ ? nullptr : ws.get<Elem>(forward_slot::k_pack, static_cast<std::size_t>(kb_ * dk_));
    float* stats = ws.get<float>(forward_slot::stats, static_cast<std::size_t>(group * 6 * bq_)) + sub * 6 * bq_;
    m_ = stats;
    l_ = stats + bq_;
    alpha_ = stats + 2 * bq_;
    lo_rel_ = stats + 3 * bq_;
    hi_rel_ = stats + 4 * bq_;
    col_max_ = stats + 5 * bq_;
  }

  // Returns the number of key blocks the tile's rows need (0 if every row is fully masked).
  int64_t start() {
    if (!find_bands()) return 0;
    pack_q();
    if constexpr (!Pairs) q_sizes();
    std::fill(m_, m_ + qvecs_ * L, -std::numeric_limits<float>::infinity());
    std::fill(l_, l_ + qvecs_ * L, 0.0f);
    return (jhi_ - jlo_ + kb_ - 1) / kb_;
  }
  // The keys [lo, hi) the tile's blocks cover, once start() returned a count above 0.
  std::pair<int64_t, int64_t> keys() const { return {jlo_, jhi_}; }
  // Folds key block `n` (< start()) into the running softmax and O; blocks go in order.
  void step(int64_t n) {
    const int64_t j0 = jlo_ + n * kb_;
    block(j0, std::min(kb_, jhi_ - j0));
  }
  void finish() { write_rows(); }

 private:
  // Bands of the tile's rows; returns false if every row is fully masked. Rows with an empty band
  // ("dead") are left out of the block range and the interior test, and written as masked.
  bool find_bands() {
    bool any = false;
    jlo_ = s_.M;
    jhi_ = 0;
    max_lo_ = 0;
    min_hi_ = s_.M;
    for (int64_t r = 0; r < rows_; ++r) {
      const detail::KeyBand band = mask_.band(b_, i0_ + r);
      live_[r] = !band.empty();
      lo_[r] = band.lo;
      hi_[r] = band.hi;
      if (!live_[r]) continue;
      any = true;
      jlo_ = std::min(jlo_, band.lo);
      jhi_ = std::max(jhi_, band.hi);
      max_lo_ = std::max(max_lo_, band.lo);
      min_hi_ = std::min(min_hi_, band.hi);
    }
    return any;
  }

  // qt [D x bq] = Q tileᵀ (Pairs: [D/2 x bq] pairs of Q); lanes past the last row are zero. Q is
  // not scaled here: scores() scales q·k once, as PyTorch's composite does. Rounding scale·q first
  // added one rounding per term, which at scores of ~100 (q·50) made out 1.3× less accurate than
  // twice the composite's error (FlashAttention's rule; tests/large_score_test.cpp).
  void pack_q() {
    const int64_t lanes = qvecs_ * L;
    int64_t d0 = 0;
    if constexpr (std::is_same_v<In, float>)
      if (p_.q_stride.col == 1)
        d0 = transpose_blocks<Ops>(q_ + i0_ * p_.q_stride.row, p_.q_stride.row, rows_, lanes, s_.D, qt_, bq_);
    for (int64_t d = d0; d < dk_; ++d) {  // d outer: the writes are contiguous
      Elem* qt = qt_ + d * bq_;
      for (int64_t r = 0; r < rows_; ++r) {
        const In* q = q_ + (i0_ + r) * p_.q_stride.row;
        if constexpr (Pairs) {
          const bool has_hi = 2 * d + 1 < s_.D;
          qt[r] = pair_bits(q[2 * d * p_.q_stride.col], has_hi ? q[(2 * d + 1) * p_.q_stride.col] : bf16{});
        } else {
          qt[r] = widen(q[d * p_.q_stride.col]);
        }
      }
      std::fill(qt + rows_, qt + lanes, Elem{});
    }
  }

  // large_scores.h's norms for the tile: a bound of |q| over its rows from Qᵀ against the head's
  // bound of |k| first (ordinary inputs stop there), then |q| of each row (0 past them, up to
  // kMaxTileRows), for refine_extent and refine_large.
  void q_sizes() {
    std::fill(qa_.begin(), qa_.end(), 0.0f);
    column_squares<Ops>(qt_, bq_, s_.D, qvecs_, qa_.data());
    refine_ = std::sqrt(largest(qa_.data(), rows_)) * k_bound_ > large_gate_limit(p_.scale, s_.D);
    if (!refine_) return;  // ordinary inputs
    column_l2_norms(qt_, bq_, rows_, s_.D, qa_.data());
    std::fill(qa_.begin() + rows_, qa_.end(), 0.0f);
    near_max_margins(qa_.data(), kMaxTileRows, k_bound_, p_.scale, s_.D, s_.M, margin_.data());
    // refine_near_max reads rows of q and k as contiguous floats.
    near_max_ = std::is_same_v<In, float> && !mask_.has_elementwise() && p_.q_stride.col == 1 && p_.k_stride.col == 1;
    separate_ = false;
  }

 public:
  // Whether a score of the tile may pass the bound: then forward_group hands it |k| of every key
  // of the head, which refine_large reads.
  bool wants_key_sizes() const { return refine_; }
  // wide, s_lo: room for large_scores.h to widen Qᵀ and rows of K (refine_room(D) doubles) and
  // for the scores' low parts (kb_·bq floats), shared by the group's tiles.
  void use_key_sizes(const float* sizes, double* wide, float* s_lo) {
    k_sizes_ = sizes;
    wide_ = wide;
    slo_ = s_lo;
  }
  // Before its first block: where the task's tile before it (its first block done) found that its
  // scores separate, this one takes refine_near_max from its first block on, not after a dense one.
  void follow(const ForwardTile& before) { separate_ = near_max_ && before.near_max_ && before.separate_; }

 private:
  void block(int64_t j0, int64_t nb) {
    const bool interior = j0 >= max_lo_ && j0 + nb <= min_hi_;  // every live row takes every key
    lo_block_ = false;
    // A NaN or Inf in V must not reach rows whose band excludes its key (0 · NaN = NaN): on a
    // band edge with such values each row sums over its own keys (accumulate_in_bands).
    rows_in_band_ =
        !interior && has_nonfinite<Ops>(v_ + j0 * p_.v_stride.row, nb, p_.v_stride.row, p_.v_stride.col, s_.Dv);
    const bool scaled = scores(j0, nb, interior);
    if (mask_.has_elementwise()) adjust(j0, nb);
    softmax(j0, nb, interior, !scaled);
    if (p_.dropout.active()) drop(j0, nb);
    accumulate(j0, nb);
  }

  // Dropout: zeroes the dropped weights of P (after their row sums took them: the softmax is of
  // every weight); the kept ones are scaled by 1 / (1 − p) once, in write_rows().
  void drop(int64_t j0, int64_t nb) {
    for_each_kept(p_.dropout, s_.H, b_, h_, i0_, rows_, j0, nb, [&](int64_t r, int64_t jj, bool kept) {
      if (!kept) st_[jj * ls_ + r] = 0.0f;  // st is Pᵀ; a dead row's P is 0 already
    });
  }

  // st [nb x bq] = scale · (K[j0 : j0+nb] · qt), rounded twice, or once where large_scores.h sums
  // again (the backward computes the same bits, but for the last bits of those refine_near_max
  // sums). interior: every live row takes every key of the block. Returns whether st is scaled
  // already: otherwise softmax() scales in its first pass over the block. With AMX, rows nb up to
  // the next multiple of 16 are written too (zero keys).
  bool scores(int64_t j0, int64_t nb, bool interior) {
    GemmArgs<Elem, Elem> g;
    g.kdim = dk_;
    const int64_t nb16 = amx_ ? (nb + 15) / 16 * 16 : nb;
    if (k_direct_ && nb16 == nb) {
      if constexpr (Pairs) {
        g.a = reinterpret_cast<const uint32_t*>(k_ + j0 * p_.k_stride.row);
        g.a_row = p_.k_stride.row / 2;
        g.a_k = 1;
      } else {
        g.a = reinterpret_cast<const float*>(k_ + j0 * p_.k_stride.row);
        g.a_row = p_.k_stride.row;
        g.a_k = p_.k_stride.col;
      }
    } else {
      for (int64_t jj = 0; jj < nb; ++jj) {
        const In* k = k_ + (j0 + jj) * p_.k_stride.row;
        for (int64_t d = 0; d < dk_; ++d) {
          if constexpr (Pairs) {
            const bf16 hi = 2 * d + 1 < s_.D ? k[(2 * d + 1) * p_.k_stride.col] : bf16{};
            kpack_[jj * dk_ + d] = pair_bits(k[2 * d * p_.k_stride.col], hi);
          } else {
            kpack_[jj * dk_ + d] = widen(k[d * p_.k_stride.col]);
          }
        }
      }
      std::fill(kpack_ + nb * dk_, kpack_ + nb16 * dk_, Elem{});
      g.a = kpack_;
      g.a_row = dk_;
      g.a_k = 1;
    }
    g.b = qt_;
    g.ldb = bq_;
    g.c = st_;
    g.ldc = ls_;
    // Where softmax() will take the block's max of the unscaled scores (its deferred scale), the
    // product folds it in as it stores them, and softmax() skips a pass over the block.
    max_folded_ = interior && !amx_ && !mask_.has_elementwise() && p_.scale > 0;
    if (max_folded_) {
      std::fill(col_max_, col_max_ + qvecs_ * L, -std::numeric_limits<float>::infinity());
      g.col_max = col_max_;
    }
    if constexpr (Pairs) {
      if (amx_) {
        Ops::TileDot::gemm(g.a, g.a_row * 4, qt_, bq_, st_, ls_, nb16, qvecs_ * L, dk_, false);
      } else {
        gemm_blocked<Ops, Dot>(g, nb, qvecs_);
      }
    } else {
      const Refine extent =
          refine_ ? refine_extent(k_sizes_ + j0, nb, qa_.data(), rows_, large_score_limit(p_.scale)) : Refine::none;
      // refine_near_max needs the fp32 scores to bound each row's largest (every live row takes every
      // key, no elementwise term after); where every score passes, a block must show it pays first.
      const bool near_max = extent != Refine::none && near_max_ && interior && (extent == Refine::some || separate_);
      if (extent != Refine::every || near_max) gemm_blocked<Ops, Dot>(g, nb, qvecs_);  // else it would be wasted
      if (extent != Refine::none) {
        if constexpr (std::is_same_v<In, float>)  // it scales the scores, whether it takes the block or not
          if (near_max &&
              (lo_block_ = refine_near_max<Ops>(g.a, g.a_row, k_sizes_ + j0, q_ + i0_ * p_.q_stride.row,
                                                p_.q_stride.row, qa_.data(), dk_, p_.scale, st_, slo_, lo_bits_, ls_,
                                                nb, qvecs_ * L, max_folded_ ? col_max_ : nullptr, m_, margin_.data(),
                                                large_score_limit(p_.scale), extent == Refine::every)))
            return true;
        if (extent == Refine::some && !near_max) scale_scores(nb);  // first: the second sums are written scaled
        near_max_ = near_max_ && !near_max;  // a block it did not separate: the tile sums the dense way
        refine_large(g, j0, nb, extent == Refine::every && !near_max);
        if (extent == Refine::every && near_max_ && !separate_ && interior)  // decided once per tile
          near_max_ = separate_ = near_max_separates<Ops>(st_, ls_, nb, qvecs_ * L, m_, margin_.data(), k_sizes_ + j0,
                                                          qa_.data(), large_score_limit(p_.scale));
        return true;
      }
    }
    // Without elementwise terms softmax() scales in its first pass over the block instead.
    if (!mask_.has_elementwise()) return false;
    scale_scores(nb);
    return true;
  }

  void scale_scores(int64_t nb) {
    // Locals: the vector stores may alias the members, which were reloaded at every store.
    const V scale = Ops::set1(p_.scale);
    float* const st = st_;
    const int64_t lanes = qvecs_ * L, ls = ls_;
    for (int64_t jj = 0; jj < nb; ++jj)
      for (int64_t g0 = 0; g0 < lanes; g0 += L)
        Ops::store(st + jj * ls + g0, Ops::mul(Ops::load(st + jj * ls + g0), scale));
  }

  // The block's scores of large |q|·|k| summed again in double and scaled there (large_scores.h):
  // row jj of st is row jj of K (as the product read it) against qt. Their low parts go to slo_
  // for softmax(), through adjust() where elementwise terms follow.
  void refine_large(const GemmArgs<float, float>& g, int64_t j0, int64_t nb, bool every) {
    lo_block_ = true;
    std::fill(lo_bits_, lo_bits_ + nb, ~uint64_t{0});
    refine_scores<Ops>(g.a, g.a_row, g.a_k, k_sizes_ + j0, qt_, bq_, qa_.data(), dk_, p_.scale, st_, slo_, ls_, nb,
                       qvecs_ * L, large_score_limit(p_.scale), every, wide_);
  }

  // Keep-mask, bias, ALiBi and softcap, through MaskEval itself (the definition), in band only;
  // the refined scores in double with their low parts (adjust_refined), as the backward does.
  // Softcap alone takes the whole block at once (softcap.h, the same bits as MaskEval's; with
  // refined scores softcap_refined_run, adjust_refined's bits): scores outside the band are capped
  // too, and softmax() masks them as before.
  void adjust(int64_t j0, int64_t nb) {
    const float cap = mask_.mask().softcap;
    const float limit = large_score_limit(p_.scale);
    const bool terms = mask_.has_terms_after_softcap();
    if (cap > 0 && lo_block_ && !terms) {  // softcap alone, some scores refined: a column at a time
      for (int64_t jj = 0; jj < nb; ++jj)
        softcap_refined_run(st_ + jj * ls_, slo_ + jj * ls_, nullptr, qa_.data(), k_sizes_[j0 + jj], limit, rows_, cap);
      return;
    }
    const bool block_cap = cap > 0 && !lo_block_;
    if (block_cap) detail::softcap_scores(st_, nullptr, nb * ls_, cap);
    if (block_cap && !terms) return;
    for (int64_t r = 0; r < rows_; ++r) {
      if (!live_[r]) continue;
      const int64_t lo = std::max<int64_t>(lo_[r] - j0, 0), hi = std::min<int64_t>(hi_[r] - j0, nb);
      for (int64_t jj = lo; jj < hi; ++jj) {
        float& s = st_[jj * ls_ + r];
        if (block_cap)
          s = mask_.add_terms(s, b_, h_, i0_ + r, j0 + jj);
        else if (lo_block_ && refined(k_sizes_[j0 + jj], qa_[r], limit))
          adjust_refined(mask_, s, slo_[jj * ls_ + r], b_, h_, i0_ + r, j0 + jj);
        else
          s = mask_.adjust(s, b_, h_, i0_ + r, j0 + jj);
      }
    }
  }

  // Online softmax over the block: scales the scores (if `scale`), masks the band edges, updates m
  // and l, turns st into P and leaves in alpha the factor that rescales the rows of O.
  void softmax(int64_t j0, int64_t nb, bool interior, bool scale) {
    const V sc = Ops::set1(p_.scale);
    // For scale > 0, max(s·scale) = max(s)·scale (rounding is monotone), so an interior block's
    // scale waits for the exponentials, which take s·scale − m in one FMA (one rounding instead of
    // two): a pass that stored the scaled block saved. Otherwise they multiply by 1 (exact).
    const bool defer = interior && scale && p_.scale > 0;
    const V k = defer ? sc : Ops::set1(1.0f);
    if (!interior) {
      // Block-relative bounds are small integers, exact in fp32; dead lanes mask everything.
      for (int64_t r = 0; r < qvecs_ * L; ++r) {
        const bool live = r < rows_ && live_[r];
        lo_rel_[r] = live ? static_cast<float>(std::clamp<int64_t>(lo_[r] - j0, -1, kb_ + 1)) : 0.0f;
        hi_rel_[r] = live ? static_cast<float>(std::clamp<int64_t>(hi_[r] - j0, -1, kb_ + 1)) : 0.0f;
      }
    }
    for (int64_t g = 0; g < qvecs_; ++g) {
      float* st = st_ + g * L;
      const V m_old = Ops::load(m_ + g * L);
      V mx = m_old;
      if (defer) {
        const V block_max = max_folded_
                                ? Ops::load(col_max_ + g * L)
                                : column_max<Ops>(st, ls_, nb, Ops::set1(-std::numeric_limits<float>::infinity()));
        mx = Ops::max(Ops::mul(block_max, sc), m_old);
      } else if (interior && scale) {
        for (int64_t jj = 0; jj < nb; ++jj) {
          const V sv = Ops::mul(Ops::load(st + jj * ls_), sc);
          Ops::store(st + jj * ls_, sv);
          mx = Ops::max(sv, mx);
        }
      } else if (interior) {
        mx = column_max<Ops>(st, ls_, nb, mx);
      } else {
        const V lo = Ops::load(lo_rel_ + g * L), hi = Ops::load(hi_rel_ + g * L);
        for (int64_t jj = 0; jj < nb; ++jj) {
          const V s = scale ? Ops::mul(Ops::load(st + jj * ls_), sc) : Ops::load(st + jj * ls_);
          const V sv = Ops::band_mask(s, Ops::set1(static_cast<float>(jj)), lo, hi);
          Ops::store(st + jj * ls_, sv);
          mx = Ops::max(sv, mx);
        }
      }
      // max() drops NaN scores, so m stays a number; a NaN score still reaches l and O through
      // 2^NaN = NaN. A row with no allowed key yet uses 0 as its max, making every p = 0.
      const V m_use = Ops::neg_inf_to_zero(mx), neg_m = Ops::sub(Ops::zero(), m_use);
      V sum = Ops::zero();
      if (lo_block_) {  // s − m is exact near the max, so the low part adds what its rounding lost
        const float* slo = slo_ + g * L;
        for (int64_t jj = 0; jj < nb; ++jj) {
          const V x =
              add_low_parts<Ops>(Ops::sub(Ops::load(st + jj * ls_), m_use), lo_bits_[jj] >> (g * L), slo + jj * ls_);
          const V pv = exp_e<Ops>(x);
          Ops::store(st + jj * ls_, pv);
          sum = Ops::add(sum, pv);
        }
      } else if (p_as_pairs()) {
        if constexpr (Pairs) sum = weights_to_pairs<Ops, Dot>(st, ls_, nb, k, neg_m, ppairs_ + g * L, bq_);
      } else {
        for (int64_t jj = 0; jj < nb; ++jj) {
          const V pv = weight<Ops>(Ops::load(st + jj * ls_), k, neg_m);
          Ops::store(st + jj * ls_, pv);
          sum = Ops::add(sum, pv);
        }
      }
      const V alpha = weight<Ops>(m_old, Ops::set1(1.0f), neg_m);
      Ops::store(alpha_ + g * L, alpha);
      Ops::store(l_ + g * L, Ops::fma(alpha, Ops::load(l_ + g * L), sum));
      Ops::store(m_ + g * L, mx);
    }
  }

  // Whether P·V on bf16 pairs takes P as pairs straight from the exponentials (softmax()): not
  // with dropout, which zeroes fp32 P, nor in block()'s rare case, which reads fp32 P.
  bool p_as_pairs() const { return pairs_pv_ && !rows_in_band_ && !p_.dropout.active(); }

  // P · V of the block into O (forward_values.h).
  void accumulate(int64_t j0, int64_t nb);
  template <class Dot, class G>
  bool into_o(G& g, int64_t vecs, const float* alpha);
  bool block_product(const In* v, int64_t nb, const float* alpha);
  bool accumulate_pairs(const In* v, int64_t nb, const float* alpha);
  template <class T>
  static void transpose_tiles(const T* src, int64_t ld_src, int64_t rows, int64_t cols, T* dst, int64_t ld_dst);

  void write_rows() {
    // Exponent bits all set: inf or NaN (a bit test, so the common loop below still vectorizes).
    uint32_t nonfinite = 0;
    bool emptied = false;
    auto flag = [&](float x) { nonfinite |= (std::bit_cast<uint32_t>(x) & 0x7f800000u) == 0x7f800000u; };
    std::array<double, kMaxTileRows> log_l;
    log_rows<kDoubleLanes<Ops>>(l_, log_l.data(), rows_);
    const float* o_rows = o_;
    if constexpr (Pairs)
      if (amx_) {  // O's rows from its transpose, into the block product's room (done with)
        transpose_tiles(o_, bq_, dvp_, qvecs_ * L, pv_, dvp_);
        o_rows = pv_;
      }
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t i = i0_ + r;
      float* out = p_.out + p_.out_stride.at(b_, h_, i);
      const bool masked = !live_[r] || l_[r] == 0.0f;  // l is NaN, not 0, if a NaN reached the row
      emptied = emptied || (live_[r] && l_[r] == 0.0f && mask_.row_has_allowed_key(b_, h_, i));
      const float inv = masked ? 0.0f : p_.dropout_scale / l_[r];
      const float* o = o_rows + r * dvp_;
      if (masked) {
        for (int64_t e = 0; e < s_.Dv; ++e) out[e * p_.out_stride.col] = 0.0f;
      } else if (p_.out_stride.col == 1) {  // the common layout, in a loop the compiler vectorizes
        for (int64_t e = 0; e < s_.Dv; ++e) {
          out[e] = o[e] * inv;
          flag(out[e]);
        }
      } else {
        for (int64_t e = 0; e < s_.Dv; ++e) {
          out[e * p_.out_stride.col] = o[e] * inv;
          flag(o[e] * inv);
        }
      }
      // m + log(l) in float64, then rounded once for an fp32 lse: both forms say the same number.
      const double lse = masked ? -std::numeric_limits<double>::infinity() : static_cast<double>(m_[r]) + log_l[r];
      if (p_.lse != nullptr) p_.lse[p_.lse_stride.at(b_, h_, i)] = static_cast<float>(lse);
      if (p_.lse_wide != nullptr) p_.lse_wide[p_.lse_stride.at(b_, h_, i)] = lse;
      nonfinite |= !masked && !std::isfinite(lse);
    }
    if (nonfinite != 0 && p_.nonfinite != nullptr) p_.nonfinite->store(true, std::memory_order_relaxed);
    if (emptied && p_.emptied != nullptr) p_.emptied->store(true, std::memory_order_relaxed);
  }

  using Dot = typename DotOf<Ops, Pairs>::type;

  const ForwardParams& p_;
  PackedBlock* packed_;               // shared by the group's tiles
  float k_bound_;                     // an upper bound of |k| over the kv head
  const float* k_sizes_ = nullptr;    // |k| of every key of the head, when refine_
  double* wide_ = nullptr;            // large_scores.h's room for Qᵀ in double, when refine_
  float* slo_ = nullptr;              // the scores' low parts (refine_large), when refine_
  bool lo_block_ = false;             // whether slo_ holds the current block's low parts
  uint64_t lo_bits_[Ops::kKeyBlock];  // their lanes, per key of the block (add_low_parts)
  const AttentionShape& s_;
  const detail::MaskEval& mask_;
  int64_t b_, h_, hk_, i0_;
  int64_t kb_;  // keys per block: ForwardParams::key_block for fp32 products, the family's for pairs
  const In *q_, *k_, *v_;
  int64_t bq_ = 0, ls_ = 0, rows_ = 0, qvecs_ = 0, dvp_ = 0, dk_ = 0;  // ls_: st_'s row stride
  bool k_direct_ = false, v_direct_ = false, first_block_ = true, pairs_pv_ = false, amx_ = false;
  bool rows_in_band_ = false;  // the current block's, set by block()
  bool max_folded_ = false;    // col_max_ holds the current block's max, set by scores()
  int64_t jlo_ = 0, jhi_ = 0, max_lo_ = 0, min_hi_ = 0;
  std::array<int64_t, kMaxTileRows> lo_, hi_;  // written by find_bands for the tile's rows
  std::array<bool, kMaxTileRows> live_;
  std::array<float, kMaxTileRows> qa_, margin_;  // written by q_sizes
  bool refine_ = false;                          // whether any score of the tile can pass the bound
  bool near_max_ = false, separate_ = false;     // refine_near_max may take the blocks; a block showed it pays
  Elem *qt_, *kpack_;
  uint32_t *vpairs_ = nullptr, *ppairs_ = nullptr, *vrows_ = nullptr;  // Pairs only; vrows_ AMX only
  float *vpack_, *st_, *o_, *pv_, *m_, *l_, *alpha_, *lo_rel_, *hi_rel_, *col_max_;
};

}  // namespace
}  // namespace qkv::kernels

#include "kernels/forward_values.h"
