// One decode task, written once for every SIMD family: the keys [j0, j1) of one sequence and KV
// head against the G·N query rows of that head's GQA group. Include only after kernel_deps.h,
// the family's target pragma, its simd_*.h, microkernel.h, and its Decode ops (decode_*.cpp:
// Ops plus hsum, reduce_lanes and the widening loads load_f16, load_bf16, load_i8).
//
// The keys go in blocks of at most kDecodeBlock within one page. Each block is read from the pool
// once and widened to fp32 into L1-resident buffers (int8: float(q) · scale, the exact value the
// cache stands for), then used by every row:
//   S [rows x nb] = (scale·Q) · Kᵀ   lanes along D, L keys reduced together (Ops::reduce_lanes)
//   online softmax per row (base 2, running max in natural units, as tile_forward.h)
//   O [rows x dvp] = alpha ⊙ O + P · V   through the shared micro-kernel (microkernel.h)
// The result is unnormalized (o, m, l): decode.cpp merges the chunks in a fixed order.
#pragma once

namespace qkv::kernels {
namespace {

constexpr float kDecodeLog2e = 1.44269504088896340736f;

inline float widen_one(KVDtype dtype, const char* src, int64_t e, float scale) {
  switch (dtype) {
    case KVDtype::f32: return reinterpret_cast<const float*>(src)[e];
    case KVDtype::bf16: return std::bit_cast<float>(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(src)[e]) << 16);
    case KVDtype::f16: return detail::half_to_float(reinterpret_cast<const uint16_t*>(src)[e]);
    case KVDtype::i8: return static_cast<float>(reinterpret_cast<const int8_t*>(src)[e]) * scale;
  }
  return 0.0f;
}

// dst[0, n) = the n stored values at src as fp32, dst[n, npad) = 0.
template <class Ops>
void widen_row(KVDtype dtype, const char* src, int64_t n, float scale, float* dst, int64_t npad) {
  constexpr int64_t L = Ops::kLanes;
  int64_t e = 0;
  if (dtype == KVDtype::f32) {
    for (; e + L <= n; e += L) Ops::store(dst + e, Ops::load(reinterpret_cast<const float*>(src) + e));
  } else if (dtype == KVDtype::bf16) {
    for (; e + L <= n; e += L) Ops::store(dst + e, Ops::load_bf16(reinterpret_cast<const uint16_t*>(src) + e));
  } else if (dtype == KVDtype::f16) {
    for (; e + L <= n; e += L) Ops::store(dst + e, Ops::load_f16(reinterpret_cast<const uint16_t*>(src) + e));
  } else {
    const typename Ops::V s = Ops::set1(scale);
    for (; e + L <= n; e += L) Ops::store(dst + e, Ops::mul(Ops::load_i8(reinterpret_cast<const int8_t*>(src) + e), s));
  }
  for (; e < n; ++e) dst[e] = widen_one(dtype, src, e, scale);
  for (; e < npad; ++e) dst[e] = 0.0f;
}

template <class Ops>
class DecodeChunk {
  using V = typename Ops::V;
  static constexpr int64_t L = Ops::kLanes;
  static constexpr int64_t kNb = kDecodeBlock;  // a multiple of every family's lanes

 public:
  DecodeChunk(const DecodeParams& p, const DecodeTask& t, Workspace& ws)
      : p_(p), t_(t), mask_(*p.mask), rows_(p.G * p.N), dp_((p.D + L - 1) / L * L),
        eb_(kv_dtype_bytes(p.dtype)) {
    qb_ = ws.get<float>(0, static_cast<std::size_t>(rows_ * dp_));
    kb_ = ws.get<float>(1, static_cast<std::size_t>(kNb * dp_));
    vb_ = ws.get<float>(2, static_cast<std::size_t>(kNb * p.dvp));
    sb_ = ws.get<float>(3, static_cast<std::size_t>(rows_ * kNb));
    band_ = ws.get<int64_t>(4, static_cast<std::size_t>(3 * rows_));
    alpha_ = ws.get<float>(5, static_cast<std::size_t>(rows_));
  }

  void run() {
    std::fill(t_.m, t_.m + rows_, -std::numeric_limits<float>::infinity());
    std::fill(t_.l, t_.l + rows_, 0.0f);
    if (!find_bands()) return;
    for (int64_t b = 0; b < 4; ++b) prefetch_block(t_.j0 + b * kNb);
    pack_q();
    bool first = true;
    for (int64_t j = t_.j0; j < t_.j1;) {
      const int64_t nb = block_size(j);
      if (any_row_sees(j, j + nb)) {
        prefetch_block(j + 4 * nb);
        block(j, nb, first);
        first = false;
      }
      j += nb;
    }
  }

 private:
  int64_t head(int64_t r) const { return t_.g * p_.G + r / p_.N; }
  int64_t query(int64_t r) const { return r % p_.N; }
  // Row r sees keys lo <= j < hi and the StreamingLLM prefix j < shi.
  int64_t lo(int64_t r) const { return band_[3 * r]; }
  int64_t hi(int64_t r) const { return band_[3 * r + 1]; }
  int64_t shi(int64_t r) const { return band_[3 * r + 2]; }
  bool row_sees(int64_t r, int64_t a, int64_t b) const { return (lo(r) < b && a < hi(r) && lo(r) < hi(r)) || a < shi(r); }
  bool row_sees_all(int64_t r, int64_t a, int64_t b) const { return (lo(r) <= a && b <= hi(r)) || b <= shi(r); }
  bool allowed(int64_t r, int64_t j) const { return (lo(r) <= j && j < hi(r)) || j < shi(r); }

  bool find_bands() {
    for (int64_t r = 0; r < rows_; ++r) {
      const detail::KeyBand band = mask_.band(t_.b, query(r));
      band_[3 * r] = band.lo;
      band_[3 * r + 1] = band.hi;
      band_[3 * r + 2] = std::min(p_.sink_tokens, band.hi);
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
      const float* q = p_.q + t_.b * p_.sq[0] + head(r) * p_.sq[1] + query(r) * p_.sq[2];
      float* dst = qb_ + r * dp_;
      for (int64_t d = 0; d < p_.D; ++d) dst[d] = q[d * p_.sq[3]] * p_.scale;
      std::fill(dst + p_.D, dst + dp_, 0.0f);
    }
  }

  // Keys of the block starting at j: up to kNb, within the chunk and within j's page.
  int64_t block_size(int64_t j) const {
    const int64_t page_end = (j / p_.page_tokens + 1) * p_.page_tokens;
    return std::min({kNb, t_.j1 - j, page_end - j});
  }

  // Asks for the K and V rows (and scales) of the block at j while the current block computes:
  // the hardware prefetcher alone left the loads of each block waiting on DRAM (the widening
  // loads took ~60% of the kernel's samples in perf).
  // always_inline: as a separate function GCC found it free of side effects (prefetches count as
  // none) and deleted every call, so no prefetch was ever issued.
  __attribute__((always_inline)) void prefetch_block(int64_t j) const {
    if (j >= t_.j1) return;
    const int64_t row0 = pool_row(j), nb = block_size(j);
    auto lines = [](const char* p, int64_t bytes) __attribute__((always_inline)) {
      for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
    };
    lines(p_.k + row0 * p_.D * eb_, nb * p_.D * eb_);
    lines(p_.v + row0 * p_.Dv * eb_, nb * p_.Dv * eb_);
    if (p_.k_scale != nullptr) {
      lines(reinterpret_cast<const char*>(p_.k_scale + row0), nb * 4);
      lines(reinterpret_cast<const char*>(p_.v_scale + row0), nb * 4);
    }
  }

  // Pool row of sequence token j (all tokens of a block share its page, in consecutive slots).
  int64_t pool_row(int64_t j) const {
    const int64_t page = p_.block_table[t_.b * p_.max_blocks + j / p_.page_tokens];
    return (page * p_.Hkv + t_.g) * p_.page_tokens + j % p_.page_tokens;
  }

  // Rows [row0, row0 + nb) of a pool as fp32 with row stride `npad`: in place for fp32 rows
  // that already have that stride, else widened into buf.
  const float* rows_fp32(const char* pool, const float* scales, int64_t row0, int64_t nb, int64_t n, int64_t npad,
                         float* buf) const {
    if (p_.dtype == KVDtype::f32 && n == npad) return reinterpret_cast<const float*>(pool) + row0 * n;
    for (int64_t jj = 0; jj < nb; ++jj)
      widen_row<Ops>(p_.dtype, pool + (row0 + jj) * n * eb_, n, scales ? scales[row0 + jj] : 0.0f, buf + jj * npad, npad);
    return buf;
  }

  void block(int64_t j0, int64_t nb, bool first) {
    const int64_t row0 = pool_row(j0);
    const float* k = rows_fp32(p_.k, p_.k_scale, row0, nb, p_.D, dp_, kb_);
    const float* v = rows_fp32(p_.v, p_.v_scale, row0, nb, p_.Dv, p_.dvp, vb_);
    scores(k, j0, nb);
    for (int64_t r = 0; r < rows_; ++r) softmax_row(r);
    GemmArgs<float, float> g;
    g.kdim = nb;
    g.a = sb_;
    g.a_row = kNb;
    g.a_k = 1;
    g.b = v;
    g.ldb = p_.dvp;
    g.c = t_.o;
    g.ldc = p_.dvp;
    g.alpha = first ? nullptr : alpha_;  // the first block writes O
    gemm_blocked<Ops>(g, rows_, p_.dvp / L);
  }

  // sb [rows x kNb]: logits of the block's keys, -inf where masked and past nb.
  void scores(const float* k, int64_t j0, int64_t nb) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < rows_; ++r) {
      float* s = sb_ + r * kNb;
      if (!row_sees(r, j0, j0 + nb)) {
        std::fill(s, s + kNb, kNegInf);
        continue;
      }
      // L keys at a time: one accumulator per key, then one transposing reduction gives the L
      // scores as a vector (~3 instructions per key instead of a horizontal sum each). Lanes past
      // nb reread the last key (in bounds) and are overwritten with -inf.
      const float* q = qb_ + r * dp_;
      for (int64_t j = 0; j < nb; j += L) {
        V acc[L];
        for (int64_t x = 0; x < L; ++x) acc[x] = Ops::zero();
        if (j + L <= nb) {
          // One pointer stepping down the rows: 16 row addresses kept apart were spilled (and
          // the accumulators with them), which made this loop the kernel's hot spot.
          for (int64_t d = 0; d < dp_; d += L) {
            const V qv = Ops::load(q + d);
            const float* kr = k + j * dp_ + d;
#pragma GCC unroll 16
            for (int64_t x = 0; x < L; ++x) {
              acc[x] = Ops::fma(qv, Ops::load(kr), acc[x]);
              kr += dp_;
            }
          }
        } else {
          for (int64_t x = 0; x < L; ++x) {
            const float* kr = k + std::min(j + x, nb - 1) * dp_;
            for (int64_t d = 0; d < dp_; d += L) acc[x] = Ops::fma(Ops::load(q + d), Ops::load(kr + d), acc[x]);
          }
        }
        Ops::store(s + j, Ops::reduce_lanes(acc));
      }
      std::fill(s + nb, s + kNb, kNegInf);
      if (!row_sees_all(r, j0, j0 + nb))
        for (int64_t jj = 0; jj < nb; ++jj)
          if (!allowed(r, j0 + jj)) s[jj] = kNegInf;
      if (mask_.has_elementwise())
        for (int64_t jj = 0; jj < nb; ++jj)
          if (s[jj] != kNegInf) s[jj] = mask_.adjust(s[jj], t_.b, head(r), query(r), j0 + jj);
    }
  }

  // Turns row r of sb into P and updates m, l and alpha (the factor for the row of O).
  void softmax_row(int64_t r) {
    float* s = sb_ + r * kNb;
    V mx = Ops::set1(t_.m[r]);
    for (int64_t jj = 0; jj < kNb; jj += L) mx = Ops::max(Ops::load(s + jj), mx);
    float m_new = t_.m[r];
    alignas(64) float lanes[L];
    Ops::store(lanes, mx);
    for (int64_t e = 0; e < L; ++e) m_new = std::max(m_new, lanes[e]);
    // A row with no allowed key yet uses 0 as its max, so every p (and alpha) is 0.
    const float m_use = m_new == -std::numeric_limits<float>::infinity() ? 0.0f : m_new;
    const V mv = Ops::set1(m_use), log2e = Ops::set1(kDecodeLog2e);
    V sum = Ops::zero();
    for (int64_t jj = 0; jj < kNb; jj += L) {
      const V pv = Ops::exp2(Ops::mul(Ops::sub(Ops::load(s + jj), mv), log2e));
      Ops::store(s + jj, pv);
      sum = Ops::add(sum, pv);
    }
    alpha_[r] = std::exp2((t_.m[r] - m_use) * kDecodeLog2e);
    t_.l[r] = alpha_[r] * t_.l[r] + Ops::hsum(sum);
    t_.m[r] = m_new;
  }

  const DecodeParams& p_;
  const DecodeTask& t_;
  const detail::MaskEval& mask_;
  int64_t rows_, dp_, eb_;
  float *qb_, *kb_, *vb_, *sb_, *alpha_;
  int64_t* band_;
};

template <class Ops>
void decode_chunk(const DecodeParams& p, const DecodeTask& t, Workspace& ws) {
  DecodeChunk<Ops>(p, t, ws).run();
}

}  // namespace
}  // namespace qkv::kernels
