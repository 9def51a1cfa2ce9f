// ForwardTile's second product, O = alpha ⊙ O + P · V of a key block (declared in forward_tile.h,
// included at its end): in fp32, on bf16 pairs, or as AMX tiles, each block's product summed on
// its own before it joins O.
#pragma once

namespace qkv::kernels {
namespace {

// O = alpha ⊙ O + P · V[j0 : j0+nb], the block summed on its own first: summed onto O, every key
// rounded at O's size (flat weights over 16k keys erred 8.7e-4, the fp32 rule allows 1e-4). With
// AMX, O is held transposed (accumulate_pairs).
template <class Ops, class In, bool Pairs>
void ForwardTile<Ops, In, Pairs>::accumulate(int64_t j0, int64_t nb) {
  const In* v = v_ + j0 * p_.v_stride.row;
  const bool first = first_block_;
  first_block_ = false;
  const float* const alpha = first ? nullptr : alpha_;  // the first block writes O itself
  bool folded = first;
  if (rows_in_band_) {
    float* const dst = first ? o_ : pv_;
    if (amx_) std::fill(dst, dst + dvp_ * bq_, 0.0f);  // Oᵀ's lanes past the rows, as the tiles leave them
    accumulate_in_bands(st_, ls_, v, p_.v_stride.row, p_.v_stride.col, s_.Dv, dvp_, rows_, live_.data(), lo_.data(),
                        hi_.data(), j0, nb, dst, amx_ ? 1 : dvp_, amx_ ? bq_ : 1);
  } else if constexpr (Pairs) {
    folded = pairs_pv_ ? accumulate_pairs(v, nb, alpha) : block_product(v, nb, alpha);
  } else {
    folded = block_product(v, nb, alpha);
  }
  if (folded) return;
  if (amx_)
    fold_block_transposed<Ops>(o_, pv_, alpha_, qvecs_ * L, dvp_, bq_);
  else
    fold_block<Ops>(o_, pv_, alpha_, rows_, dvp_);
}

// Where K runs in one pass the micro-kernel stores alpha ⊙ O + (P·V)_block (fold_block's FMA,
// without its pass over O); else the product goes to pv_. Returns whether O is done.
template <class Ops, class In, bool Pairs>
template <class Dot, class G>
bool ForwardTile<Ops, In, Pairs>::into_o(G& g, int64_t vecs, const float* alpha) {
  const bool direct = alpha == nullptr || gemm_chunk<Ops, Dot>(g, vecs) >= g.kdim;
  g.c = direct ? o_ : pv_;
  g.alpha = direct ? alpha : nullptr;
  return direct;
}

// P · V[j0 : j0+nb] in fp32, into O or pv_ (into_o).
template <class Ops, class In, bool Pairs>
bool ForwardTile<Ops, In, Pairs>::block_product(const In* v, int64_t nb, const float* alpha) {
  GemmArgs<float, float> g;
  g.kdim = nb;
  g.a = st_;
  g.a_row = 1;
  g.a_k = ls_;
  if (v_direct_) {
    g.b = reinterpret_cast<const float*>(v);
    g.ldb = p_.v_stride.row;
  } else {
    if (packed_->v != v || packed_->nb != nb) {  // another tile of the group may have packed it
      pack_values(v, nb, p_.v_stride.row, p_.v_stride.col, s_.Dv, dvp_, vpack_);
      *packed_ = {v, nb};
    }
    g.b = vpack_;
    g.ldb = dvp_;
  }
  g.ldc = dvp_;
  const bool folded = into_o<FloatDot<Ops>>(g, dvp_ / L, alpha);
  gemm_blocked<Ops>(g, rows_, dvp_ / L);
  return folded;
}

// P · V[j0 : j0+nb] on pairs of keys, into O or pv_ (into_o): ppairs [nb/2 x bq] = P rounded to
// bf16, vpairs [nb/2 x dvp] = V's bf16 as given (an odd block gets a zero key; with AMX, zero
// keys up to a multiple of 32, the tile product's depth).
template <class Ops, class In, bool Pairs>
bool ForwardTile<Ops, In, Pairs>::accumulate_pairs(const In* v, int64_t nb, const float* alpha) {
  using Dot = typename Ops::PairDot;
  const int64_t kp = amx_ ? (nb + 31) / 32 * 16 : (nb + 1) / 2, lanes = qvecs_ * L;
  if (!p_as_pairs()) {
    std::fill(st_ + nb * ls_, st_ + 2 * kp * ls_, 0.0f);  // 2·kp <= kb_: room
    for (int64_t k = 0; k < kp; ++k)
      for (int64_t g = 0; g < lanes; g += L)
        Dot::round_pairs(Ops::load(st_ + 2 * k * ls_ + g), Ops::load(st_ + (2 * k + 1) * ls_ + g),
                         ppairs_ + k * bq_ + g);
  } else if (amx_) {  // the pairs past the block's keys up to the tile product's depth
    std::fill(ppairs_ + (nb + 1) / 2 * bq_, ppairs_ + kp * bq_, 0u);
  }
  const int64_t sm = p_.v_stride.row, se = p_.v_stride.col;
  const int64_t full = se == 1 ? s_.Dv / L * L : 0;
  if (packed_->v != v || packed_->nb != nb) {  // another tile of the group may have packed it
    std::fill(vpairs_ + (nb + 1) / 2 * dvp_, vpairs_ + kp * dvp_, 0u);
    for (int64_t k = 0; k < (nb + 1) / 2; ++k) {
      const In* lo = v + 2 * k * sm;
      const In* hi = 2 * k + 1 < nb ? lo + sm : nullptr;
      uint32_t* dst = vpairs_ + k * dvp_;
      for (int64_t e = 0; e < full; e += L)
        Dot::interleave(reinterpret_cast<const uint16_t*>(lo + e),
                        hi ? reinterpret_cast<const uint16_t*>(hi + e) : nullptr, dst + e);
      for (int64_t e = full; e < s_.Dv; ++e) dst[e] = pair_bits(lo[e * se], hi ? hi[e * se] : bf16{});
      std::fill(dst + s_.Dv, dst + dvp_, 0u);
    }
    if (amx_) transpose_tiles(vpairs_, dvp_, kp, dvp_, vrows_, kp);
    *packed_ = {v, nb};
  }
  if (amx_) {
    // Oᵀ = Vᵀ · Pᵀ: A = V's pairs transposed (one row per value column, the group's), B = P's
    // pairs as the exponentials wrote them, so no tile transposes its P.
    Ops::TileDot::gemm(vrows_, kp * 4, ppairs_, bq_, alpha == nullptr ? o_ : pv_, bq_, dvp_, lanes, kp, false);
    return alpha == nullptr;
  }
  GemmArgs<uint32_t, uint32_t> g;
  g.kdim = kp;
  g.a = ppairs_;
  g.a_row = 1;
  g.a_k = bq_;
  g.b = vpairs_;
  g.ldb = dvp_;
  g.ldc = dvp_;
  const bool folded = into_o<Dot>(g, dvp_ / L, alpha);
  gemm_blocked<Ops, Dot>(g, rows_, dvp_ / L);
  return folded;
}

// dst [cols x rows] = src [rows x cols] transposed in 32-bit elements (rows, cols: multiples of
// Ops::kTranspose), src rows ld_src apart, dst rows ld_dst apart.
template <class Ops, class In, bool Pairs>
template <class T>
void ForwardTile<Ops, In, Pairs>::transpose_tiles(const T* src, int64_t ld_src, int64_t rows, int64_t cols, T* dst,
                                                  int64_t ld_dst) {
  constexpr int64_t n = Ops::kTranspose;
  for (int64_t r0 = 0; r0 < rows; r0 += n)
    for (int64_t c0 = 0; c0 < cols; c0 += n)
      Ops::transpose(reinterpret_cast<const float*>(src + r0 * ld_src + c0), ld_src, n,
                     reinterpret_cast<float*>(dst + c0 * ld_dst + r0), ld_dst);
}

}  // namespace
}  // namespace qkv::kernels
