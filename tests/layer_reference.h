// The multi-head layer recomputed in float64 from weights given as plain vectors (so tests can
// perturb them for finite differences): X·W + b, reference attention per head, concat, ·W_o + b_o.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "qkv/layer.h"
#include "qkv/reference.h"

namespace qkv::test {

using Weights64 = std::map<std::string, std::vector<double>>;

inline Weights64 weights64(const MultiHeadAttention& layer) {
  Weights64 w;
  for (const auto& [name, t] : layer.parameters()) w[name].assign(t->data(), t->data() + t->numel());
  return w;
}

// y[r, :] = x[r, :] · w + b for x [rows, e], w [e, n]; b may be absent.
inline std::vector<double> project64(const double* x, int64_t rows, int64_t e, const std::vector<double>& w,
                                     const std::vector<double>* b) {
  const int64_t n = static_cast<int64_t>(w.size()) / e;
  std::vector<double> y(static_cast<std::size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double acc = b ? (*b)[j] : 0.0;
      for (int64_t i = 0; i < e; ++i) acc += x[r * e + i] * w[i * n + j];
      y[r * n + j] = acc;
    }
  return y;
}

// Rows [B, T, heads·dim] copied into a contiguous [B, heads, T, dim] tensor (explicit permute).
inline Tensor<double> split_heads(const std::vector<double>& rows, int64_t B, int64_t T, int64_t heads, int64_t dim) {
  Tensor<double> out({B, heads, T, dim});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < dim; ++d) out.view()(b, h, t, d) = rows[((b * T + t) * heads + h) * dim + d];
  return out;
}

// x: [B, N, E], kv: [B, M, E] or null (self-attention). Returns y [B·N, out_dim] row-major.
inline std::vector<double> layer_forward64(const LayerConfig& c, const Weights64& w, const std::vector<double>& x,
                                           const std::vector<double>* kv, int64_t B, int64_t N, int64_t M,
                                           const AttentionOptions& options) {
  const int64_t H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim, Dv = c.value_dim, E = c.embed_dim;
  const std::vector<double>& src = kv ? *kv : x;
  auto bias = [&](const char* name) { return w.count(name) ? &w.at(name) : nullptr; };
  std::vector<double> q = x, k = src, v = src;
  if (!c.parameter_free) {
    q = project64(x.data(), B * N, E, w.at("w_q"), bias("b_q"));
    k = project64(src.data(), B * M, E, w.at("w_k"), bias("b_k"));
    v = project64(src.data(), B * M, E, w.at("w_v"), bias("b_v"));
  }
  Tensor<double> q4 = split_heads(q, B, N, H, D), k4 = split_heads(k, B, M, Hkv, D), v4 = split_heads(v, B, M, Hkv, Dv);
  Tensor<double> out({B, H, N, Dv});
  reference_attention_forward(out.view(), {}, {}, q4.cview(), k4.cview(), v4.cview(), options);
  std::vector<double> ctx(static_cast<std::size_t>(B * N * H * Dv));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t e = 0; e < Dv; ++e) ctx[((b * N + n) * H + h) * Dv + e] = out.view()(b, h, n, e);
  if (!c.output_projection) return ctx;
  return project64(ctx.data(), B * N, H * Dv, w.at("w_o"), bias("b_o"));
}

}  // namespace qkv::test
