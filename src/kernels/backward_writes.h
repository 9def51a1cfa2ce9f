// BackwardTile's gradients on their way out (declared in backward_tile.h, included at its end):
// dq after each head, dk and dv (or a chunk's partial sums of them) after the last head of the
// group, each through scale_row, which notes a non-finite value written.
#pragma once

namespace qkv::kernels {
namespace {

// dst[d * stride] = scale · src[d] for d < width, noting in worst_ an inf or NaN written.
template <class Ops>
void BackwardTile<Ops>::scale_row(float* dst, int64_t stride, const float* src, float scale, int64_t width) {
  uint32_t worst = 0;
  if (stride == 1)
    for (int64_t d = 0; d < width; ++d) dst[d] = scale * src[d], worst = std::max(worst, exponent_bits(dst[d]));
  else
    for (int64_t d = 0; d < width; ++d)
      dst[d * stride] = scale * src[d], worst = std::max(worst, exponent_bits(dst[d * stride]));
  worst_ = std::max(worst_, worst);
}

// Every gradient leaves the task through scale_row or the dbias writes, which keep in worst_ the
// largest exponent field they wrote: all ones is an inf or NaN, which run() reports through
// p_.nonfinite so the caller can tell an fp32 overflow from non-finite inputs (overflow.h).
// An integer max, so the loops stay vectorized, and no pass of its own over the gradients.
template <class Ops>
void BackwardTile<Ops>::report_nonfinite() const {
  if (worst_ == 0x7F800000u && p_.nonfinite != nullptr) p_.nonfinite->store(true, std::memory_order_relaxed);
}

// scale · dk and dv sums: into dk, dv for chunk 0 (every key, those past keys_ from zeros), else
// into this chunk's partials (the keys of keys_).
template <class Ops>
void BackwardTile<Ops>::write_key_sums() {
  for (int64_t j = keys_.lo; j < keys_.hi && chunk_ > 0; ++j) {
    const int64_t key = ((chunk_ - 1) * s_.B + b_) * s_.Hkv * s_.M + hk_ * s_.M + j;
    scale_row(p_.dk_part + key * s_.D, 1, key_sums(dk_, j, dp_), p_.scale, s_.D);
    scale_row(p_.dv_part + key * s_.Dv, 1, key_sums(dv_, j, dvp_), 1.0f, s_.Dv);
  }
  for (int64_t j = 0; j < s_.M && chunk_ == 0; ++j) {
    const bool summed = j >= keys_.lo && j < keys_.hi;
    scale_row(p_.dk + p_.dk_stride.at(b_, hk_, j), p_.dk_stride.col, summed ? key_sums(dk_, j, dp_) : zeros_, p_.scale,
              s_.D);
    scale_row(p_.dv + p_.dv_stride.at(b_, hk_, j), p_.dv_stride.col, summed ? key_sums(dv_, j, dvp_) : zeros_, 1.0f,
              s_.Dv);
  }
}

template <class Ops>
void BackwardTile<Ops>::write_dq(int64_t h) {
  for (int64_t i = r0_; i < r1_; ++i) {
    float* dq = p_.dq + p_.dq_stride.at(b_, h, i);
    scale_row(dq, p_.dq_stride.col, dq_ + (i - r0_) * dp_, p_.scale, s_.D);
  }
}

}  // namespace
}  // namespace qkv::kernels
