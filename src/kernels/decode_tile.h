// One decode task, written once for every SIMD family: the keys [j0, j1) of one sequence and KV
// head against the G·N query rows of that head's GQA group. Include after a family's
// <isa>/ops.h, whose <Isa>Decode adds to its Ops hsum, hmax, reduce_lanes and the widening loads
// load_f16, load_bf16, load_i8 (and, where measured to help, keep_in_register); it includes the
// softmax's e^x (softmax_columns.h) itself.
//
// The keys go in blocks of p.block_keys (decode_block_keys), which may span pages. Each K and V
// vector of a block is loaded from the pool and widened to fp32 in registers once, and used there
// by a tile of up to 8 rows (a buffer re-read per row cost ~20% of the cycles in perf):
//   S [rows x nb] = (scale·Q) · Kᵀ   lanes along D, R rows x L/R keys reduced together
//   online softmax per row (base 2, running max in natural units, as forward_tile.h), the max
//   moved only when a score passes it by ln 8 (softmax_row)
//   O [rows x dvp] = alpha ⊙ O + P · V   R rows x C vectors of O in registers
// int8 is widened as the stored integers; its scales act once per key and row instead of on
// the 2·D elements: s = k_scale · (q · k_int), o += (p · v_scale) · v_int.
// Head dims that are not a multiple of L take a fallback: rows widened into zero-padded buffers.
// The result is unnormalized (o, m, l): decode.cpp merges the chunks in a fixed order.
#pragma once

#include "core/kv_codec.h"
#include "kernels/softmax_columns.h"

namespace qkv::kernels {
namespace {

// dst[0, n) = the n stored values at src as fp32 (int8: the integers, unscaled), dst[n, npad) = 0.
template <class Ops>
void widen_row(KVDtype dtype, const char* src, int64_t n, float* dst, int64_t npad) {
  constexpr int64_t L = Ops::kLanes;
  int64_t e = 0;
  if (dtype == KVDtype::f32) {
    for (; e + L <= n; e += L) Ops::store(dst + e, Ops::load(reinterpret_cast<const float*>(src) + e));
  } else if (dtype == KVDtype::bf16) {
    for (; e + L <= n; e += L) Ops::store(dst + e, Ops::load_bf16(reinterpret_cast<const uint16_t*>(src) + e));
  } else if (dtype == KVDtype::f16) {
    for (; e + L <= n; e += L) Ops::store(dst + e, Ops::load_f16(reinterpret_cast<const uint16_t*>(src) + e));
  } else {
    for (; e + L <= n; e += L) Ops::store(dst + e, Ops::load_i8(reinterpret_cast<const int8_t*>(src) + e));
  }
  for (; e < n; ++e) dst[e] = detail::kv_decode_unscaled(dtype, src, e);
  for (; e < npad; ++e) dst[e] = 0.0f;
}

template <class Ops>
class DecodeChunk {
  using V = typename Ops::V;
  static constexpr int64_t L = Ops::kLanes;
  static constexpr int64_t kNb = kDecodeBlock;  // a multiple of every family's lanes
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

 public:
  DecodeChunk(const DecodeParams& p, const DecodeTask& t, Workspace& ws)
      : p_(p), t_(t), mask_(*p.mask), rows_(p.G * p.N), dp_((p.D + L - 1) / L * L), eb_(kv_dtype_bytes(p.dtype)) {
    qb_ = ws.get<float>(decode_slot::q, static_cast<std::size_t>(rows_ * dp_));
    kb_ = ws.get<float>(decode_slot::k_wide, static_cast<std::size_t>(kNb * dp_));
    vb_ = ws.get<float>(decode_slot::v_wide, static_cast<std::size_t>(kNb * p.dvp));
    sb_ = ws.get<float>(decode_slot::scores, static_cast<std::size_t>(rows_ * kNb));
    band_ = ws.get<int64_t>(decode_slot::bands, static_cast<std::size_t>(3 * rows_));
    alpha_ = ws.get<float>(decode_slot::alpha, static_cast<std::size_t>(rows_));
  }

  void run() {
    std::fill(t_.m, t_.m + rows_, kNegInf);
    std::fill(t_.l, t_.l + rows_, 0.0f);
    if (!find_bands()) return;
    pack_q();
    bool first = true;
    for (int64_t j = t_.j0; j < t_.j1;) {
      const int64_t nb = block_size(j);
      if (any_row_sees(j, j + nb)) {
        block(j, nb, first);
        first = false;
      }
      j += nb;
    }
    // A row that sees keys here but kept none (l = 0) stays m = -inf: a keep-mask or -inf bias
    // may have removed them, and the merge, which sees every chunk, tells that from scores below
    // -FLT_MAX (decode.cpp's merge_row).
  }

 private:
  int64_t head(int64_t r) const { return t_.g * p_.G + r / p_.N; }
  int64_t query(int64_t r) const { return r % p_.N; }
  // Row r sees keys lo <= j < hi and the StreamingLLM prefix j < shi.
  int64_t lo(int64_t r) const { return band_[3 * r]; }
  int64_t hi(int64_t r) const { return band_[3 * r + 1]; }
  int64_t shi(int64_t r) const { return band_[3 * r + 2]; }
  bool row_sees(int64_t r, int64_t a, int64_t b) const {
    return (lo(r) < b && a < hi(r) && lo(r) < hi(r)) || a < shi(r);
  }
  bool row_sees_all(int64_t r, int64_t a, int64_t b) const { return (lo(r) <= a && b <= hi(r)) || b <= shi(r); }
  bool allowed(int64_t r, int64_t j) const { return (lo(r) <= j && j < hi(r)) || j < shi(r); }

  bool find_bands() {
    for (int64_t r = 0; r < rows_; ++r) {
      const DecodeBand band = decode_band(p_, t_.b, query(r));
      band_[3 * r] = band.lo;
      band_[3 * r + 1] = band.hi;
      band_[3 * r + 2] = band.prefix_end;
    }
    return any_row_sees(t_.j0, t_.j1);
  }
  bool any_row_sees(int64_t a, int64_t b) const {
    for (int64_t r = 0; r < rows_; ++r)
      if (row_sees(r, a, b)) return true;
    return false;
  }

  void pack_q() {
    for (int64_t r = 0; r < rows_; ++r) {
      const float* q = p_.q + p_.q_stride.at(t_.b, head(r), query(r));
      float* dst = qb_ + r * dp_;
      for (int64_t d = 0; d < p_.D; ++d) dst[d] = q[d * p_.q_stride.col] * p_.scale;
      std::fill(dst + p_.D, dst + dp_, 0.0f);
    }
  }

  // Keys of the block starting at j: up to p_.block_keys, within the chunk (a block may span
  // pages: small pages would otherwise make short blocks, each paying the softmax and O update).
  int64_t block_size(int64_t j) const { return std::min(p_.block_keys, t_.j1 - j); }

  // One cursor runs p_.prefetch_keys ahead of the keys being scored and asks for the K and V rows (and
  // int8 scales) of as many keys as it scores, through the block table: the requests are spread
  // over the compute, V arrives before its P·V pass, and pages are crossed as the keys cross them.
  // It replaced a row prefetch within one-page blocks (K while scoring, V during P·V, max(8 keys,
  // 2 KB) ahead, prefetcht2) plus whole next pages 32 keys ahead. Streaming from memory (bench
  // "cold", 2 rounds, CPU time per step) prefetcht0 8 keys ahead took D1 M = 32768 from 12.5-13.0
  // to 11.8-12.1 ms (f32), 7.7-7.8 to 7.0-7.1 (f16), 5.5 to 4.7-4.8 (i8), D2 contiguous 22.9-23.6
  // to 21.8-21.9 and D2 paged (16 tokens, shuffled) 28.5-28.9 to 22.4-23.7. 4 and 16 keys ahead,
  // or prefetcht2 at 8, 24 or 96 keys, were slower on some of these then (64-key blocks); how far
  // ahead it runs now is decode_prefetch_keys's (decode.h).
  // The cursor runs on to t_.pf_end, past the task's keys when the thread's next task takes them.
  // prefetch_next(n) asks for the next n keys' rows at once, one address range per page they lie
  // in (a page's rows are contiguous). Asked for key by key, the cursor's bookkeeping made a step
  // with the cache in L2 (Zen 5, D = 128, one KV head, M = 1024, 1 thread) 6-7% slower at f16, 4%
  // at int8 and 12-20% at f32; streaming (D1 M = 32768) it moved nothing beyond the rounds' spread.
  // always_inline: as separate functions GCC found them free of side effects (prefetches count
  // as none) and deleted every call, so no prefetch was ever issued.
  __attribute__((always_inline)) void prefetch_seek(int64_t j) {
    pf_j_ = j;
    pf_seeked_ = true;
    if (j < t_.pf_end) pf_row_ = pool_row(j), pf_off_ = j % p_.page_tokens;
  }
  __attribute__((always_inline)) void prefetch_next(int64_t n) {
    // The lines of [a, a_end) and of [b, b_end), a line of each per step: one loop for K and V,
    // and one for their int8 scales. With a loop per range the bookkeeping showed: f16 and bf16
    // steps (four lines a key in each of K and V) took 3-5% longer from L2 and L3 (Zen 5).
    auto ask = [](uintptr_t line) __attribute__((always_inline)) {
      __builtin_prefetch(reinterpret_cast<const char*>(line), 0, 3);
    };
    auto lines = [&ask](uintptr_t a, uintptr_t a_end, uintptr_t b, uintptr_t b_end) __attribute__((always_inline)) {
      const uintptr_t a0 = a & ~uintptr_t{63}, b0 = b & ~uintptr_t{63};
      const uintptr_t na = a < a_end ? (a_end - a0 + 63) >> 6 : 0, nb = b < b_end ? (b_end - b0 + 63) >> 6 : 0;
      const uintptr_t both = std::min(na, nb);
      for (uintptr_t i = 0; i < both; ++i) ask(a0 + 64 * i), ask(b0 + 64 * i);
      for (uintptr_t i = both; i < na; ++i) ask(a0 + 64 * i);
      for (uintptr_t i = both; i < nb; ++i) ask(b0 + 64 * i);
    };
    while (n > 0 && pf_j_ < t_.pf_end) {
      const int64_t run = std::min({n, p_.page_tokens - pf_off_, t_.pf_end - pf_j_});
      const auto k = reinterpret_cast<uintptr_t>(p_.k + pf_row_ * p_.D * eb_);
      const auto v = reinterpret_cast<uintptr_t>(p_.v + pf_row_ * p_.Dv * eb_);
      lines(k, k + static_cast<uintptr_t>(run * p_.D * eb_), v, v + static_cast<uintptr_t>(run * p_.Dv * eb_));
      if (p_.k_scale != nullptr) {
        // From the first line boundary in the run: the line it starts inside held the last run's
        // final scale, asked for then (the first run after a seek asks for its own).
        const auto ks = reinterpret_cast<uintptr_t>(p_.k_scale + pf_row_);
        const auto vs = reinterpret_cast<uintptr_t>(p_.v_scale + pf_row_);
        const auto from = [&](uintptr_t a) { return pf_seeked_ ? a : (a + 63) & ~uintptr_t{63}; };
        const auto bytes = static_cast<uintptr_t>(run) * 4;
        lines(from(ks), ks + bytes, from(vs), vs + bytes);
      }
      pf_seeked_ = false;
      n -= run;
      pf_j_ += run;
      if ((pf_off_ += run) == p_.page_tokens)
        prefetch_seek(pf_j_);  // the next page: one division per page
      else
        pf_row_ += run;
    }
  }

  // Pool row of sequence token j.
  int64_t pool_row(int64_t j) const {
    const int64_t page = p_.block_table[t_.b * p_.max_blocks + j / p_.page_tokens];
    return (page * p_.Hkv + t_.g) * p_.page_tokens + j % p_.page_tokens;
  }

  // A block's rows: row jj at base + jj · stride bytes (one page, or the widened buffers), or
  // at rows[jj] (a block spanning pages; tables for every block cost 7-10% at one page).
  struct Strided {
    const char* base;
    int64_t stride;
    const char* operator[](int64_t jj) const { return base + jj * stride; }
  };
  struct Table {
    const char* const* rows;
    const char* operator[](int64_t jj) const { return rows[jj]; }
  };

  // Head dims that are not a multiple of L take the rows widened into zero-padded fp32 buffers.
  void block(int64_t j0, int64_t nb, bool first) {
    const bool buffered = p_.D % L != 0 || p_.Dv % L != 0, i8 = p_.dtype == KVDtype::i8;
    int64_t off = j0 % p_.page_tokens, row = pool_row(j0);
    if (pf_j_ < j0 + p_.prefetch_keys) prefetch_seek(j0 + p_.prefetch_keys);  // the start, or blocks skipped
    if (!buffered && off + nb <= p_.page_tokens) {
      const Strided k{p_.k + row * p_.D * eb_, p_.D * eb_}, v{p_.v + row * p_.Dv * eb_, p_.Dv * eb_};
      return typed(k, v, i8 ? p_.k_scale + row : nullptr, i8 ? p_.v_scale + row : nullptr, j0, nb, first);
    }
    for (int64_t jj = 0; jj < nb; ++jj, ++off, ++row) {
      if (off == p_.page_tokens) {  // divisions once per page, not per key
        off = 0;
        row = pool_row(j0 + jj);
      }
      krow_[jj] = p_.k + row * p_.D * eb_;
      vrow_[jj] = p_.v + row * p_.Dv * eb_;
      if (i8) ksc_[jj] = p_.k_scale[row], vsc_[jj] = p_.v_scale[row];
      if (buffered) {
        widen_row<Ops>(p_.dtype, krow_[jj], p_.D, kb_ + jj * dp_, dp_);
        widen_row<Ops>(p_.dtype, vrow_[jj], p_.Dv, vb_ + jj * p_.dvp, p_.dvp);
      }
    }
    const float* ksc = i8 ? ksc_ : nullptr;
    const float* vsc = i8 ? vsc_ : nullptr;
    if (buffered) {
      const Strided k{reinterpret_cast<const char*>(kb_), dp_ * 4}, v{reinterpret_cast<const char*>(vb_), p_.dvp * 4};
      return block_typed<KVDtype::f32>(k, v, ksc, vsc, p_.dvp, j0, nb, first);
    }
    typed(Table{krow_}, Table{vrow_}, ksc, vsc, j0, nb, first);
  }

  template <class Rows>
  void typed(Rows k, Rows v, const float* ksc, const float* vsc, int64_t j0, int64_t nb, bool first) {
    switch (p_.dtype) {
      case KVDtype::f32:
        return block_typed<KVDtype::f32>(k, v, ksc, vsc, p_.Dv, j0, nb, first);
      case KVDtype::bf16:
        return block_typed<KVDtype::bf16>(k, v, ksc, vsc, p_.Dv, j0, nb, first);
      case KVDtype::f16:
        return block_typed<KVDtype::f16>(k, v, ksc, vsc, p_.Dv, j0, nb, first);
      case KVDtype::i8:
        return block_typed<KVDtype::i8>(k, v, ksc, vsc, p_.Dv, j0, nb, first);
    }
  }

  // L values of type kDt at element e of row `row` (bytes), widened to fp32 in registers.
  template <KVDtype kDt>
  static V load_kv(const char* row, int64_t e) {
    if constexpr (kDt == KVDtype::f32)
      return Ops::load(reinterpret_cast<const float*>(row) + e);
    else if constexpr (kDt == KVDtype::bf16)
      return Ops::load_bf16(reinterpret_cast<const uint16_t*>(row) + e);
    else if constexpr (kDt == KVDtype::f16)
      return Ops::load_f16(reinterpret_cast<const uint16_t*>(row) + e);
    else
      return Ops::load_i8(reinterpret_cast<const int8_t*>(row) + e);
  }

  // The block's rows k, v hold type kDt; O gets columns [0, ve). The int8 scales (ksc, vsc per
  // key, else null) are folded in: s = k_scale · (q · k_int), and p · v_scale multiplies v_int.
  // Its four steps are forced inline (GCC kept them out of line, each with its own set-up a
  // block) and the softmax's max moves lazily (softmax_row). Both together, against neither (both
  // builds in one process, bench/decode_ab.cpp, Zen 5, D1, one thread): AVX-512's 256-key blocks
  // cold at M = 16384 and 32768 f16 0.99-1.02, bf16 0.98, int8 0.98-0.99, f32 0.99, from L3
  // 0.98-0.99; AVX2's 64-key blocks cold 0.90-0.98 and from L3 0.88-0.96.
  template <KVDtype kDt, class Rows>
  void block_typed(Rows k, Rows v, const float* ksc, const float* vsc, int64_t ve, int64_t j0, int64_t nb, bool first) {
    for_row_tiles([&]<int R>(int64_t r0) { scores_tile<kDt, R>(k, r0, nb); });
    const int64_t nbp = (nb + L - 1) / L * L;  // small pages make short blocks
    rescale_ = false;
    for (int64_t r = 0; r < rows_; ++r) {
      finish_scores(r, j0, nb, nbp, ksc);
      softmax_row(r, nbp);
      if (vsc != nullptr) {
        float* s = sb_ + r * kNb;
        for (int64_t jj = 0; jj < nb; ++jj) s[jj] *= vsc[jj];
      }
    }
    for_row_tiles([&]<int R>(int64_t r0) {
      constexpr int64_t C = pv_vecs(R);
      int64_t e = 0;
      for (; e + C * L <= ve; e += C * L) pv_tile<kDt, R, C>(v, r0, e, nb, first);
      for (; e < ve; e += L) pv_tile<kDt, R, 1>(v, r0, e, nb, first);
    });
  }

  // Calls f.template operator()<R>(r0) over tiles of R rows covering [0, rows): R = 8, 4, 2, 1,
  // at most L (one reduction of L accumulators gives a tile's scores of L / R keys).
  template <class F>
  void for_row_tiles(const F& f) const {
    int64_t r0 = 0;
    if constexpr (L >= 8)
      for (; r0 + 8 <= rows_; r0 += 8) f.template operator()<8>(r0);
    if constexpr (L >= 4)
      for (; r0 + 4 <= rows_; r0 += 4) f.template operator()<4>(r0);
    if constexpr (L >= 2)
      for (; r0 + 2 <= rows_; r0 += 2) f.template operator()<2>(r0);
    for (; r0 < rows_; ++r0) f.template operator()<1>(r0);
  }

  // sb rows [r0, r0 + R), keys [0, nb): the raw dot products q · k. Each key vector is loaded
  // (and widened) once for the R rows; X = L / R keys at a time keep R·X = L accumulators in
  // registers, reduced by one transposing reduction (Ops::reduce_lanes). Keys past nb reread
  // the last key (in bounds); finish_scores overwrites them.
  template <KVDtype kDt, int R, class Rows>
  __attribute__((always_inline)) void scores_tile(Rows k, int64_t r0, int64_t nb) {
    constexpr int64_t X = L / R;
    const float* q = qb_ + r0 * dp_;
    for (int64_t j = 0; j < nb; j += X) {
      if (r0 == 0) prefetch_next(std::min(X, nb - j));
      const char* kr[X];
      for (int64_t x = 0; x < X; ++x) kr[x] = k[std::min(j + x, nb - 1)];
      V acc[L];
      for (int64_t i = 0; i < L; ++i) acc[i] = Ops::zero();
      for (int64_t d = 0; d < dp_; d += L) {
        V kv[X];
        for (int64_t x = 0; x < X; ++x) kv[x] = load_kv<kDt>(kr[x], d);
        for (int64_t r = 0; r < R; ++r) {
          V qv = Ops::load(q + r * dp_ + d);
          if constexpr (requires { Ops::keep_in_register(qv); }) Ops::keep_in_register(qv);
          for (int64_t x = 0; x < X; ++x) acc[r * X + x] = Ops::fma(qv, kv[x], acc[r * X + x]);
        }
      }
      alignas(64) float lanes[L];
      Ops::store(lanes, Ops::reduce_lanes(acc));
      for (int64_t r = 0; r < R; ++r)
        for (int64_t x = 0; x < X; ++x) sb_[(r0 + r) * kNb + j + x] = lanes[r * X + x];
    }
  }

  // Row r of sb: the logits of the block's keys, -inf where masked and in [nb, nbp).
  __attribute__((always_inline)) void finish_scores(int64_t r, int64_t j0, int64_t nb, int64_t nbp,
                                                    const float* k_scale) {
    float* s = sb_ + r * kNb;
    std::fill(s + nb, s + nbp, kNegInf);
    if (!row_sees(r, j0, j0 + nb)) {
      std::fill(s, s + nb, kNegInf);
      return;
    }
    if (k_scale != nullptr)
      for (int64_t jj = 0; jj < nb; ++jj) s[jj] *= k_scale[jj];
    // Softcap for the whole row at once (softcap.h: MaskEval's bits), before the band's -inf.
    if (mask_.mask().softcap > 0) detail::softcap_scores(s, nullptr, nb, mask_.mask().softcap);
    if (!row_sees_all(r, j0, j0 + nb))
      for (int64_t jj = 0; jj < nb; ++jj)
        if (!allowed(r, j0 + jj)) s[jj] = kNegInf;
    if (mask_.has_terms_after_softcap())
      for (int64_t jj = 0; jj < nb; ++jj)
        if (s[jj] != kNegInf) s[jj] = mask_.add_terms(s[jj], t_.b, head(r), query(r), j0 + jj);
  }

  // Vectors of O per row in a P·V tile of R rows: at most 16 accumulators and 8 vectors, and the
  // R·C accumulators, C vectors of V and a broadcast of P all in the family's registers (with
  // 4 × 4 on AVX2's 16, perf showed half the accumulators spilled to the stack every key). A
  // power of two, so the tiles split each row of V at its cache lines.
  static constexpr int64_t pv_vecs(int64_t R) {
    const int64_t fit = std::min({int64_t{8}, 16 / R, (Ops::kRegisters - 1) / (R + 1)});
    return static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(std::max<int64_t>(1, fit))));
  }

  // O rows [r0, r0 + R), columns [e, e + C·L) = alpha ⊙ O + P · V (the first block: P · V), with
  // the R·C accumulators in registers and each V vector loaded (and widened) once for the R rows.
  // The block's sums start from 0 and join O once at the end: carried on from O, every key of a
  // long cache would round at O's size, an error that grew with the cache's length.
  template <KVDtype kDt, int R, int64_t C, class Rows>
  __attribute__((always_inline)) void pv_tile(Rows v, int64_t r0, int64_t e, int64_t nb, bool first) {
    V acc[R][C];
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) acc[r][c] = Ops::zero();
    const float* pr = sb_ + r0 * kNb;
    for (int64_t jj = 0; jj < nb; ++jj) {
      const char* vr = v[jj];
      V vv[C];
      for (int64_t c = 0; c < C; ++c) vv[c] = load_kv<kDt>(vr, e + c * L);
      for (int64_t r = 0; r < R; ++r) {
        const V pb = Ops::set1(pr[r * kNb + jj]);
        for (int64_t c = 0; c < C; ++c) acc[r][c] = Ops::fma(pb, vv[c], acc[r][c]);
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      float* o = t_.o + (r0 + r) * p_.dvp + e;
      const V a = Ops::set1(alpha_[r0 + r]);
      for (int64_t c = 0; c < C; ++c)
        Ops::store(o + c * L, first      ? acc[r][c]
                              : rescale_ ? Ops::fma(a, Ops::load(o + c * L), acc[r][c])
                                         : Ops::add(Ops::load(o + c * L), acc[r][c]));
    }
  }

  // Turns row r of sb [0, nbp) into P and updates m, l and alpha (the factor for the row of O).
  // m moves only when a score reaches kLazySlack above it (or is the row's first allowed one):
  // below that p = e^(s - m) <= 8, and the block skips the max's reduction, alpha's exponential
  // and O's rescale.
  __attribute__((always_inline)) void softmax_row(int64_t r, int64_t nbp) {
    float* s = sb_ + r * kNb;
    const float m_old = t_.m[r];
    // With no allowed key yet, any finite score moves m.
    const V limit = Ops::set1(m_old == kNegInf ? std::numeric_limits<float>::lowest() : m_old + kLazySlack);
    uint32_t above = 0;
    for (int64_t jj = 0; jj < nbp; jj += L) above |= Ops::ge_mask(Ops::load(s + jj), limit);
    alpha_[r] = 1.0f;
    if (above != 0) {
      V mx = Ops::set1(m_old);
      for (int64_t jj = 0; jj < nbp; jj += L) mx = Ops::max(Ops::load(s + jj), mx);
      const float m_new = Ops::hmax(mx);
      alignas(64) float alpha[L];
      Ops::store(alpha, exp_e<Ops>(Ops::set1(m_old - m_new)));  // 0 for a row's first keys
      alpha_[r] = alpha[0];
      rescale_ = true;
      t_.m[r] = m_new;
    }
    // A row with no allowed key yet uses 0 as its max, so every p is 0.
    const V mv = Ops::set1(t_.m[r] == kNegInf ? 0.0f : t_.m[r]);
    V sum = Ops::zero();
    for (int64_t jj = 0; jj < nbp; jj += L) {
      const V pv = exp_e<Ops>(Ops::sub(Ops::load(s + jj), mv));
      Ops::store(s + jj, pv);
      sum = Ops::add(sum, pv);
    }
    t_.l[r] = alpha_[r] * t_.l[r] + Ops::hsum(sum);
  }

  const DecodeParams& p_;
  const DecodeTask& t_;
  const detail::MaskEval& mask_;
  int64_t rows_, dp_, eb_;
  float *qb_, *kb_, *vb_, *sb_, *alpha_;
  int64_t* band_;
  // A block's K and V rows and int8 scales when it spans pages.
  const char* krow_[kNb];
  const char* vrow_[kNb];
  float ksc_[kNb], vsc_[kNb];
  // The prefetch cursor: its key, that key's pool row and offset in its page.
  int64_t pf_j_ = -1, pf_row_ = 0, pf_off_ = 0;
  bool pf_seeked_ = true;                          // no run since the last seek
  bool rescale_ = false;                           // some row's m moved in this block: O is scaled by alpha
  static constexpr float kLazySlack = 2.0794415f;  // ln 8
};

template <class Ops>
void decode_tile(const DecodeParams& p, const DecodeTask& t, Workspace& ws) {
  DecodeChunk<Ops>(p, t, ws).run();
}

}  // namespace
}  // namespace qkv::kernels
