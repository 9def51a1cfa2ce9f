// BackwardTile's keys whose dS needs more than P ∘ (dP − D) in fp32 (declared in backward_tile.h,
// included at its end): with large q the heavy keys of a row, and the key that dominates a
// near-one-hot row, whose dS would otherwise carry the cancellation of dP against D.
#pragma once

namespace qkv::kernels {
namespace {

// With large q (refine_), the keys of a row's weight of at least 1/16 (at most 16 per row) take
// dP − D summed in double: dk = dSᵀ·q multiplies its rounding by that large q, and the fp32
// chains over Dv round at the size of their partial sums (~5x PyTorch's small matmuls, which sum
// in lanes): with keys sharing a row's weight that took dk to 2.5x PyTorch's error at q·50
// (docs/accuracy.md). Lighter keys pass on a rounding below 1/16 of it.
template <class Ops>
void BackwardTile<Ops>::heavy_keys(int64_t row, int64_t rows, int64_t j0, int64_t cols) {
  constexpr float kHeavy = 0.0625f;
  for (int64_t r = 0; r < rows; ++r) {
    if (!(row_pmax_[r] >= kHeavy) || single_[r]) continue;  // most tiles of a peaked row
    const float* pr = st_ + r * T;
    const float* dop = dout_ + (row + r) * dvp_;
    for (int64_t c = 0; c < cols; ++c) {
      if (!(pr[c] >= kHeavy)) continue;
      double dp = wide_dot(dop, p_.vf() + p_.v_stride.at(b_, hk_, j0 + c), p_.v_stride.col, s_.Dv);
      if (p_.dropout.active()) dp = keep_[r * T + c] ? dp * dropout_scale(p_.dropout) : 0.0;
      ds_[r * T + c] = pr[c] * static_cast<float>(dp - row_dot_wide_[row + r]);
    }
  }
}

// With large q (refine_) and whole rows, a row's dominant key (its first key of P > 1/2; two
// keys of weight 1/2 can both round past it) takes its dS only once every key of the row is
// seen: dS_dom = −Σ of the other keys' dS (the logits' gradients sum to 0, as ΣP = 1 and
// D = ΣP·dP). Each of those carries D's rounding times its own P, so the dominant key gets it
// times 1 − P_dom, where P_dom·(dP − D) or dout·(v − out) gets all of out's rounding: with a
// near-one-hot row and q scaled by 50, one ulp of out took dk to 2.6x PyTorch's error (whose
// Σ P·dP cancels the same way; docs/accuracy.md). Here: the dominant key's dS leaves the tile's
// products (0) and the others' dS, before softcap's factor, join the row's sum in double, in key
// order. The sum runs in 8 double lanes (one serial chain of double adds cost 15% of q·50's
// backward), in a fixed order; columns past cols hold dS = 0.
template <class Ops>
void BackwardTile<Ops>::defer_dominant_keys(int64_t row, int64_t rows, int64_t j0, int64_t cols) {
  static_assert(T % 8 == 0);
  for (int64_t r = 0; r < rows; ++r) {
    float* ds = ds_ + r * T;
    const float* pr = st_ + r * T;
    if (row_pmax_[r] > 0.5f && dominant_[row + r] < 0)
      for (int64_t c = 0; c < cols; ++c)
        if (pr[c] > 0.5f) {
          dominant_[row + r] = j0 + c;
          dominant_cap_[row + r] = cap_ > 0 ? dcap_[r * T + c] : 1.0f;
          ds[c] = 0.0f;
          break;
        }
    Wide sum{};
    for (int64_t c = 0; c < T; c += 8) {
      Narrow x;
      std::memcpy(&x, ds + c, sizeof x);
      Wide w;
      widen_floats(x, w);
      sum += w;
    }
    others_[row + r] += ((sum[0] + sum[1]) + (sum[2] + sum[3])) + ((sum[4] + sum[5]) + (sum[6] + sum[7]));
  }
}

// The deferred dominant keys of head h's chunk (defer_dominant_keys): dS = −(the others' sum),
// written to dbias when asked, times softcap's factor, then dk += dS·q and dq += dS·k.
template <class Ops>
void BackwardTile<Ops>::settle_dominant_keys(int64_t h) {
  for (int64_t row = 0; row < r1_ - r0_; ++row) {
    const int64_t j = dominant_[row];
    if (j < 0) continue;
    const float logit_grad = static_cast<float>(-others_[row]);
    if (p_.dbias != nullptr) {
      p_.dbias[p_.dbias_stride.at(b_, h, r0_ + row) + j * p_.dbias_stride.col] = logit_grad;
      worst_ = std::max(worst_, exponent_bits(logit_grad));
    }
    const float ds = logit_grad * dominant_cap_[row];
    const float* q = q_ + row * dp_;
    const float* k = p_.kf() + p_.k_stride.at(b_, hk_, j);
    float* dk = key_sums(dk_sum_, j, dp_);
    float* dq = dq_ + row * dp_;
    for (int64_t d = 0; d < s_.D; ++d) {
      dk[d] = std::fma(ds, q[d], dk[d]);
      dq[d] = std::fma(ds, k[d * p_.k_stride.col], dq[d]);
    }
  }
}

// Otherwise each key of P > 1/2 in a row (one, or two of weight ~1/2) gets dP − D as dout · (v − out), which
// is the same quantity in exact arithmetic: with a near-one-hot softmax dP and D are nearly
// equal, their difference cancels and keeps only the two dot products' rounding, while
// v − out is exact (Sterbenz) and small. That rounding, amplified by large q through dk, was the
// error that kept dk behind PyTorch's composite (whose sum(P·dP) cancels dP's own rounding).
template <class Ops>
void BackwardTile<Ops>::dominant_key(int64_t row, int64_t h, int64_t i, int64_t j0, int64_t cols, const float* pr,
                                     float* ds) {
  const float* out = p_.out + p_.out_stride.at(b_, h, i);
  const float* dop = dout_ + row * dvp_;
  for (int64_t c = 0; c < cols; ++c) {
    if (!(pr[c] > 0.5f)) continue;
    const float* v = p_.vf() + p_.v_stride.at(b_, hk_, j0 + c);
    // With dropout, dP − D = dout · (v·Z / (1 − p) − out): the difference is no longer exact.
    // z is 1 without dropout (dropout_scale 1), and v·1 is exact.
    const float z = !p_.dropout.active() || keep_[row_in_tile(row) * T + c] ? p_.dropout_scale : 0.0f;
    float x = 0.0f;
    for (int64_t e = 0; e < s_.Dv; ++e)
      x = std::fma(dop[e], v[e * p_.v_stride.col] * z - out[e * p_.out_stride.col], x);
    ds[c] = pr[c] * x;
  }
}

}  // namespace
}  // namespace qkv::kernels
