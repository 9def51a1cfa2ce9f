// The plain fp32 composite softmax(q·kᵀ·scale [softcapped, causal]) · v and its backward, computed
// the way PyTorch's fp32 autograd computes it (scores rounded to fp32, softmax with its row max
// subtracted, D = Σ P ∘ dP, per-head dk, dv summed over each group of query heads). It is the
// "x_pt" peer of FlashAttention's acceptance rule max|x − x_ref| ≤ 2·max|x_pt − x_ref| + 1e-5.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "qkv/dropout.h"
#include "qkv/tensor.h"

namespace qkv::test {

struct Composite32 {
  Tensor<float> out, dq, dk, dv;
};

// q [B,H,N,D], k [B,Hkv,M,D], v [B,Hkv,M,Dv], dout [B,H,N,Dv], all contiguous. causal: top-left.
// dropout: as torch.nn.functional.dropout on P, with qkv's keep-mask (noise = Z / (1 − p) in fp32).
inline Composite32 composite32(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                               const Tensor<float>& dout, float scale, float softcap, bool causal,
                               const Dropout& dropout = {}) {
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), D = q.dim(3), Hkv = k.dim(1), M = k.dim(2), Dv = v.dim(3);
  const int64_t group = H / Hkv;
  Composite32 r{Tensor<float>({B, H, N, Dv}), Tensor<float>({B, H, N, D}), Tensor<float>({B, Hkv, M, D}),
                Tensor<float>({B, Hkv, M, Dv})};
  for (int64_t i = 0; i < r.dk.numel(); ++i) r.dk[i] = 0.0f;
  for (int64_t i = 0; i < r.dv.numel(); ++i) r.dv[i] = 0.0f;
  std::vector<float> p(static_cast<size_t>(N * M)), ds(static_cast<size_t>(N * M)), dcap(static_cast<size_t>(N * M));
  std::vector<float> hk(static_cast<size_t>(M * D)), hv(static_cast<size_t>(M * Dv));
  std::vector<float> noise(static_cast<size_t>(N * M), 1.0f);
  const float kept = dropout.active() ? 1.0f / static_cast<float>(1.0 - dropout.p) : 1.0f;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q.data() + (b * H + h) * N * D;
      const float* kh = k.data() + (b * Hkv + h / group) * M * D;
      const float* vh = v.data() + (b * Hkv + h / group) * M * Dv;
      const float* doh = dout.data() + (b * H + h) * N * Dv;
      for (int64_t i = 0; i < N; ++i) {
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < M; ++j) {
          float s = 0.0f;
          for (int64_t d = 0; d < D; ++d) s += qh[i * D + d] * kh[j * D + d];
          s *= scale;
          dcap[i * M + j] = 1.0f;
          if (softcap > 0) {
            const float t = std::tanh(s / softcap);
            s = softcap * t;
            dcap[i * M + j] = 1.0f - t * t;
          }
          if (causal && j > i) s = -std::numeric_limits<float>::infinity();
          p[i * M + j] = s;
          mx = std::max(mx, s);
        }
        float l = 0.0f;
        for (int64_t j = 0; j < M; ++j) l += p[i * M + j] = std::exp(p[i * M + j] - mx);
        for (int64_t j = 0; j < M; ++j) p[i * M + j] /= l;
        if (dropout.active()) {
          const DropoutRow row(dropout, H, b, h, i);
          for (int64_t j = 0; j < M; ++j) noise[i * M + j] = row.keep(j) ? kept : 0.0f;
        }
        for (int64_t e = 0; e < Dv; ++e) {
          float o = 0.0f;
          for (int64_t j = 0; j < M; ++j) o += p[i * M + j] * noise[i * M + j] * vh[j * Dv + e];
          r.out[((b * H + h) * N + i) * Dv + e] = o;
        }
        // dS = P ∘ (dP − Σ P ∘ dP), times softcap's derivative, times scale (for q·kᵀ).
        float dot = 0.0f;
        for (int64_t j = 0; j < M; ++j) {
          float dp = 0.0f;
          for (int64_t e = 0; e < Dv; ++e) dp += doh[i * Dv + e] * vh[j * Dv + e];
          dp *= noise[i * M + j];
          ds[i * M + j] = dp;
          dot += p[i * M + j] * dp;
        }
        for (int64_t j = 0; j < M; ++j) ds[i * M + j] = p[i * M + j] * (ds[i * M + j] - dot) * dcap[i * M + j] * scale;
        for (int64_t d = 0; d < D; ++d) {
          float g = 0.0f;
          for (int64_t j = 0; j < M; ++j) g += ds[i * M + j] * kh[j * D + d];
          r.dq[((b * H + h) * N + i) * D + d] = g;
        }
      }
      for (int64_t j = 0; j < M; ++j) {  // this head's dk, dv, then added to the group's
        for (int64_t d = 0; d < D; ++d) {
          float g = 0.0f;
          for (int64_t i = 0; i < N; ++i) g += ds[i * M + j] * qh[i * D + d];
          hk[j * D + d] = g;
        }
        for (int64_t e = 0; e < Dv; ++e) {
          float g = 0.0f;
          for (int64_t i = 0; i < N; ++i) g += p[i * M + j] * noise[i * M + j] * doh[i * Dv + e];
          hv[j * Dv + e] = g;
        }
      }
      float* dkh = r.dk.data() + (b * Hkv + h / group) * M * D;
      float* dvh = r.dv.data() + (b * Hkv + h / group) * M * Dv;
      for (int64_t x = 0; x < M * D; ++x) dkh[x] += hk[x];
      for (int64_t x = 0; x < M * Dv; ++x) dvh[x] += hv[x];
    }
  return r;
}

}  // namespace qkv::test
