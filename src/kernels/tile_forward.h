// One tile of the fused forward kernel (FlashAttention-2 style), written once for every SIMD
// family: Ops is a family's vector operations (simd_*.h). Include only after kernel_deps.h, the
// family's target pragma, its simd_*.h and microkernel.h.
//
// The scores of a key block are computed transposed, Sᵀ [keys x queries], so that each vector
// lane is one query row: the row max, the exponentials and the row sums are then plain vertical
// vector operations, and both block products fit the one micro-kernel (microkernel.h):
//   Sᵀ = K · (scale·Q)ᵀ   (A = rows of K read in place through their strides, B = packed Qᵀ)
//   O  = alpha ⊙ O + P · V (A = Pᵀ read transposed,                          B = rows of V)
// Softmax runs in base 2 with the running max m kept in natural units: p = 2^(s·log2e − m·log2e).
#pragma once

namespace qkv::kernels {
namespace {

constexpr float kLog2e = 1.44269504088896340736f;
constexpr int64_t kMaxTileRows = 64;

// q: [B,H,N,D], k: [B,Hkv,M,D], v: [B,Hkv,M,Dv] -> out: [B,H,N,Dv], lse: [B,H,N], for the rows
// [i0, i0 + tile_rows) of one (b, h).
template <class Ops>
class ForwardTile {
  using V = typename Ops::V;
  static constexpr int L = Ops::kLanes;
  static constexpr int64_t kBc = Ops::kKeyBlock;

 public:
  ForwardTile(const ForwardParams& p, const TileTask& t, Workspace& ws)
      : p_(p), s_(p.shape), mask_(*p.mask), b_(t.b), h_(t.h), hk_(t.h / (p.shape.H / p.shape.Hkv)), i0_(t.i0) {
    bq_ = p.tile_rows;
    rows_ = std::min(bq_, s_.N - i0_);
    qvecs_ = (rows_ + L - 1) / L;
    dvp_ = (s_.Dv + L - 1) / L * L;
    v_direct_ = p.sv[3] == 1 && dvp_ == s_.Dv;
    qt_ = ws.floats(0, static_cast<std::size_t>(s_.D * bq_));
    st_ = ws.floats(1, static_cast<std::size_t>(kBc * bq_));
    o_ = ws.floats(2, static_cast<std::size_t>(bq_ * dvp_));
    vpack_ = v_direct_ ? nullptr : ws.floats(3, static_cast<std::size_t>(kBc * dvp_));
    float* stats = ws.floats(4, static_cast<std::size_t>(5 * bq_));
    m_ = stats;
    l_ = stats + bq_;
    alpha_ = stats + 2 * bq_;
    lo_rel_ = stats + 3 * bq_;
    hi_rel_ = stats + 4 * bq_;
  }

  void run() {
    if (find_bands()) {
      pack_q();
      std::fill(m_, m_ + qvecs_ * L, -std::numeric_limits<float>::infinity());
      std::fill(l_, l_ + qvecs_ * L, 0.0f);
      std::fill(o_, o_ + rows_ * dvp_, 0.0f);
      for (int64_t j0 = jlo_; j0 < jhi_; j0 += kBc) block(j0, std::min(kBc, jhi_ - j0));
    }
    write_rows();
  }

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

  // qt [D x bq] = scale · Q tileᵀ; lanes past the last row are zero.
  void pack_q() {
    const int64_t lanes = qvecs_ * L;
    for (int64_t r = 0; r < lanes; ++r) {
      if (r < rows_) {
        const float* q = p_.q + b_ * p_.sq[0] + h_ * p_.sq[1] + (i0_ + r) * p_.sq[2];
        for (int64_t d = 0; d < s_.D; ++d) qt_[d * bq_ + r] = q[d * p_.sq[3]] * p_.scale;
      } else {
        for (int64_t d = 0; d < s_.D; ++d) qt_[d * bq_ + r] = 0.0f;
      }
    }
  }

  void block(int64_t j0, int64_t nb) {
    const bool interior = j0 >= max_lo_ && j0 + nb <= min_hi_;
    scores(j0, nb);
    if (mask_.has_elementwise()) adjust(j0, nb);
    softmax(j0, nb, interior);
    accumulate(j0, nb, interior);
  }

  // st [nb x bq] = K[j0 : j0+nb] · qt.
  void scores(int64_t j0, int64_t nb) {
    GemmArgs g;
    g.kdim = s_.D;
    g.a = p_.k + b_ * p_.sk[0] + hk_ * p_.sk[1] + j0 * p_.sk[2];
    g.a_row = p_.sk[2];
    g.a_k = p_.sk[3];
    g.b = qt_;
    g.ldb = bq_;
    g.c = st_;
    g.ldc = bq_;
    gemm_blocked<Ops>(g, nb, qvecs_);
  }

  // Keep-mask, bias, ALiBi and softcap, through MaskEval itself (the definition), in band only.
  void adjust(int64_t j0, int64_t nb) {
    for (int64_t r = 0; r < rows_; ++r) {
      if (!live_[r]) continue;
      const int64_t lo = std::max<int64_t>(lo_[r] - j0, 0), hi = std::min<int64_t>(hi_[r] - j0, nb);
      for (int64_t jj = lo; jj < hi; ++jj) st_[jj * bq_ + r] = mask_.adjust(st_[jj * bq_ + r], b_, h_, i0_ + r, j0 + jj);
    }
  }

  // Online softmax over the block: masks the band edges, updates m and l, turns st into P and
  // leaves in alpha the factor that rescales the rows of O.
  void softmax(int64_t j0, int64_t nb, bool interior) {
    if (!interior) {
      // Block-relative bounds are small integers, exact in fp32; dead lanes mask everything.
      for (int64_t r = 0; r < qvecs_ * L; ++r) {
        const bool live = r < rows_ && live_[r];
        lo_rel_[r] = live ? static_cast<float>(std::clamp<int64_t>(lo_[r] - j0, -1, kBc + 1)) : 0.0f;
        hi_rel_[r] = live ? static_cast<float>(std::clamp<int64_t>(hi_[r] - j0, -1, kBc + 1)) : 0.0f;
      }
    }
    for (int64_t g = 0; g < qvecs_; ++g) {
      float* st = st_ + g * L;
      const V m_old = Ops::load(m_ + g * L);
      V mx = m_old;
      if (interior) {
        for (int64_t jj = 0; jj < nb; ++jj) mx = Ops::max(Ops::load(st + jj * bq_), mx);
      } else {
        const V lo = Ops::load(lo_rel_ + g * L), hi = Ops::load(hi_rel_ + g * L);
        for (int64_t jj = 0; jj < nb; ++jj) {
          const V sv = Ops::band_mask(Ops::load(st + jj * bq_), Ops::set1(static_cast<float>(jj)), lo, hi);
          Ops::store(st + jj * bq_, sv);
          mx = Ops::max(sv, mx);
        }
      }
      // max() drops NaN scores, so m stays a number; a NaN score still reaches l and O through
      // 2^NaN = NaN. A row with no allowed key yet uses 0 as its max, making every p = 0.
      const V m_use = Ops::neg_inf_to_zero(mx);
      const V neg_m = Ops::mul(m_use, Ops::set1(-kLog2e));
      const V log2e = Ops::set1(kLog2e);
      V sum = Ops::zero();
      for (int64_t jj = 0; jj < nb; ++jj) {
        const V pv = Ops::exp2(Ops::fma(Ops::load(st + jj * bq_), log2e, neg_m));
        Ops::store(st + jj * bq_, pv);
        sum = Ops::add(sum, pv);
      }
      const V alpha = Ops::exp2(Ops::mul(Ops::sub(m_old, m_use), log2e));
      Ops::store(alpha_ + g * L, alpha);
      Ops::store(l_ + g * L, Ops::fma(alpha, Ops::load(l_ + g * L), sum));
      Ops::store(m_ + g * L, mx);
    }
  }

  // O = alpha ⊙ O + P · V[j0 : j0+nb].
  void accumulate(int64_t j0, int64_t nb, bool interior) {
    const float* v = p_.v + b_ * p_.sv[0] + hk_ * p_.sv[1] + j0 * p_.sv[2];
    int64_t ldv = p_.sv[2];
    if (!v_direct_) {
      for (int64_t jj = 0; jj < nb; ++jj) {
        for (int64_t e = 0; e < s_.Dv; ++e) vpack_[jj * dvp_ + e] = v[jj * p_.sv[2] + e * p_.sv[3]];
        for (int64_t e = s_.Dv; e < dvp_; ++e) vpack_[jj * dvp_ + e] = 0.0f;
      }
      v = vpack_;
      ldv = dvp_;
    }
    GemmArgs g;
    g.kdim = nb;
    g.a = st_;
    g.a_row = 1;
    g.a_k = bq_;
    g.b = v;
    g.ldb = ldv;
    g.c = o_;
    g.ldc = dvp_;
    g.alpha = alpha_;
    if (interior || !has_nonfinite(v, ldv, nb)) {
      gemm_blocked<Ops>(g, rows_, dvp_ / L);
      return;
    }
    // A NaN or Inf in V must not reach rows whose band excludes its key (0 · NaN = NaN), so on a
    // band edge with such values each row takes only its own keys.
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t lo = live_[r] ? std::clamp<int64_t>(lo_[r] - j0, 0, nb) : 0;
      const int64_t hi = live_[r] ? std::clamp<int64_t>(hi_[r] - j0, lo, nb) : lo;
      GemmArgs row = g;
      row.kdim = hi - lo;
      row.a = st_ + lo * bq_ + r;
      row.b = v + lo * ldv;
      row.c = o_ + r * dvp_;
      row.alpha = alpha_ + r;
      gemm_blocked<Ops>(row, 1, dvp_ / L);
    }
  }

  bool has_nonfinite(const float* v, int64_t ldv, int64_t nb) const {
    V acc = Ops::zero();  // x · 0 is NaN exactly when x is Inf or NaN
    for (int64_t jj = 0; jj < nb; ++jj)
      for (int64_t e = 0; e < dvp_; e += L) acc = Ops::fma(Ops::load(v + jj * ldv + e), Ops::zero(), acc);
    return Ops::any_nan(acc);
  }

  void write_rows() {
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t i = i0_ + r;
      float* out = p_.out + b_ * p_.so[0] + h_ * p_.so[1] + i * p_.so[2];
      const bool masked = !live_[r] || l_[r] == 0.0f;  // l is NaN, not 0, if a NaN reached the row
      const float inv = masked ? 0.0f : 1.0f / l_[r];
      for (int64_t e = 0; e < s_.Dv; ++e) out[e * p_.so[3]] = masked ? 0.0f : o_[r * dvp_ + e] * inv;
      if (p_.lse != nullptr)
        p_.lse[b_ * p_.sl[0] + h_ * p_.sl[1] + i * p_.sl[2]] =
            masked ? -std::numeric_limits<float>::infinity() : m_[r] + std::log(l_[r]);
    }
  }

  const ForwardParams& p_;
  const AttentionShape& s_;
  const detail::MaskEval& mask_;
  int64_t b_, h_, hk_, i0_;
  int64_t bq_ = 0, rows_ = 0, qvecs_ = 0, dvp_ = 0;
  bool v_direct_ = false;
  int64_t jlo_ = 0, jhi_ = 0, max_lo_ = 0, min_hi_ = 0;
  std::array<int64_t, kMaxTileRows> lo_{}, hi_{};
  std::array<bool, kMaxTileRows> live_{};
  float *qt_, *st_, *o_, *vpack_, *m_, *l_, *alpha_, *lo_rel_, *hi_rel_;
};

template <class Ops>
void forward_tile(const ForwardParams& p, const TileTask& task, Workspace& ws) {
  ForwardTile<Ops>(p, task, ws).run();
}

// Applies Ops::exp2 to n values (for the accuracy test).
template <class Ops>
void exp2_array(const float* x, float* y, int64_t n) {
  float in[Ops::kLanes], out[Ops::kLanes];
  for (int64_t i = 0; i < n; i += Ops::kLanes) {
    const int64_t c = std::min<int64_t>(Ops::kLanes, n - i);
    for (int64_t j = 0; j < Ops::kLanes; ++j) in[j] = j < c ? x[i + j] : 0.0f;
    Ops::store(out, Ops::exp2(Ops::load(in)));
    for (int64_t j = 0; j < c; ++j) y[i + j] = out[j];
  }
}

}  // namespace
}  // namespace qkv::kernels
