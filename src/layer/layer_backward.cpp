// MultiHeadAttention::backward: the layer's forward run in reverse. Projection gradients are
// sgemm products over all B·N (or B·M) rows; the attention part is attention_backward on the same
// strided head views the forward used.
#include <algorithm>
#include <array>
#include <optional>
#include <span>

#include <fmt/format.h>

#include "core/blas.h"
#include "attention/output_checks.h"
#include "layer/layer_shapes.h"
#include "qkv/backward.h"
#include "qkv/layer.h"

namespace qkv {
namespace {

// Rank-3 [B, T, W] or rank-2 [T, W] buffer, matching the caller's input rank (`t` when it has that
// shape: its values are overwritten).
Tensor<float> rows_tensor(bool batched, int64_t B, int64_t T, int64_t W, const char* what, Tensor<float> t) {
  return batched ? detail::reuse_or_new(std::move(t), {B, T, W}, what)
                 : detail::reuse_or_new(std::move(t), {T, W}, what);
}

// dw = inᵀ · dout: [e, n] from in [rows, e] and dout [rows, n]; db = column sums of dout. A
// gradient already in the map with its shape is overwritten in place.
void projection_grads(TensorMap& grads, const char* w_name, const char* b_name, bool has_bias, const float* in,
                      const float* dout, int64_t rows, int64_t e, int64_t n, int threads) {
  Tensor<float>& dw = grads[w_name];
  dw = detail::reuse_or_new(std::move(dw), {e, n}, w_name);
  detail::sgemm(true, false, e, n, rows, 1.0f, in, e, dout, n, 0.0f, dw.data(), n, threads);
  if (!has_bias) return;
  Tensor<float>& db = grads[b_name];
  db = detail::reuse_or_new(std::move(db), {n}, b_name);
  std::fill(db.data(), db.data() + n, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) db[j] += dout[r * n + j];
}

// din (+)= dout · wᵀ: [rows, e] from dout [rows, n] and w [e, n].
void input_grad(float* din, const float* dout, const Tensor<float>& w, int64_t rows, bool accumulate, int threads) {
  const int64_t e = w.dim(0), n = w.dim(1);
  detail::sgemm(false, true, rows, e, n, 1.0f, dout, n, w.data(), n, accumulate ? 1.0f : 0.0f, din, e, threads);
}

}  // namespace

// dy: [B, N, E_out] -> grads of w_q [E, H·D], w_k [E, Hkv·D], w_v [E, Hkv·Dv], w_o [H·Dv, E_out],
// biases; dx: [B, N, E]; dkv: [B, M, E].
void MultiHeadAttention::backward(const LayerCache& c, TensorView<const float> dy, const AttentionOptions& options,
                                  TensorMap* grads, Tensor<float>* dx, Tensor<float>* dkv) const {
  const LayerConfig& cf = config_;
  if (c.ctx.rank() != 3 || c.x.rank() != 3)
    throw Error("layer backward: the cache is empty; run forward(x, kv, options, &cache) first");
  const int64_t B = c.batch, N = c.queries, M = c.keys, E = cf.embed_dim, out_dim = output_dim();
  const int64_t H = cf.num_heads, Hkv = cf.num_kv_heads, D = cf.head_dim, Dv = cf.value_dim;
  // Every tensor the cache holds, against this layer's config (none where it holds none): one
  // filled by a layer of another head split (the same E and H·Dv) once reached attention_backward
  // and failed there.
  using Want = std::optional<std::array<int64_t, 3>>;
  auto check = [](const char* name, std::span<const int64_t> got, const Want& want) {
    if (want ? std::ranges::equal(got, *want) : got.empty()) return;
    throw Error(fmt::format(
        "layer backward: the cache was filled by a layer with a different config ({} has shape {}, this layer needs "
        "{})",
        name, shape_string(got), want ? shape_string(*want) : "none"));
  };
  const bool projected = !cf.parameter_free;
  check("x", c.x.shape(), Want({B, N, E}));
  check("kv", c.kv.shape(), c.cross ? Want({B, M, E}) : std::nullopt);
  check("q", c.q.shape(), projected ? Want({B, N, H * D}) : std::nullopt);
  check("k", c.k.shape(), projected ? Want({B, M, Hkv * D}) : std::nullopt);
  check("v", c.v.shape(), projected ? Want({B, M, Hkv * Dv}) : std::nullopt);
  check("attention output", c.ctx.shape(), Want({B, N, H * Dv}));
  check("lse", c.lse.shape(), Want({B, H, N}));
  const std::array<int64_t, 3> want3{B, N, out_dim};
  const std::span<const int64_t> want(c.batched ? want3.data() : want3.data() + 1, c.batched ? 3 : 2);
  if (!std::equal(dy.shape().begin(), dy.shape().end(), want.begin(), want.end()))
    throw Error(fmt::format("layer backward: dy has shape {} but the forward's output is {}", shape_string(dy.shape()),
                            shape_string(want)));
  const int64_t rows = B * N, kv_rows = B * M;
  detail::require_data(dy, "layer backward: dy");
  detail::check_parameter_shapes(*this, "layer backward");
  // dy is copied first: it may be a view of an output written below (dx, a gradient).
  c.backward_dy = detail::contiguous_rows(dy, B, N, out_dim, "dy", std::move(c.backward_dy));
  const float* dy_rows = c.backward_dy.data();  // y = x + ... (residual): dx gets dy too
  TensorMap local;
  TensorMap& g = grads ? *grads : local;

  const float* dctx = dy_rows;
  if (cf.output_projection) {
    c.backward_dctx = detail::reuse_or_new(std::move(c.backward_dctx), {B, N, H * Dv}, "d attention output");
    input_grad(c.backward_dctx.data(), dy_rows, w_o, rows, false, options.num_threads);
    projection_grads(g, "w_o", "b_o", cf.bias, c.ctx.data(), dy_rows, rows, H * Dv, E, options.num_threads);
    dctx = c.backward_dctx.data();
  }

  const float* kv_in = c.cross ? c.kv.data() : c.x.data();
  const float* q_data = cf.parameter_free ? c.x.data() : c.q.data();
  const float* k_data = cf.parameter_free ? kv_in : c.k.data();
  const float* v_data = cf.parameter_free ? kv_in : c.v.data();
  Tensor<float>& dq = c.backward_dq = detail::reuse_or_new(std::move(c.backward_dq), {B, N, H * D}, "dq");
  Tensor<float>& dk = c.backward_dk = detail::reuse_or_new(std::move(c.backward_dk), {B, M, Hkv * D}, "dk");
  Tensor<float>& dv = c.backward_dv = detail::reuse_or_new(std::move(c.backward_dv), {B, M, Hkv * Dv}, "dv");
  attention_backward(detail::head_view(dq.data(), B, H, N, D), detail::head_view(dk.data(), B, Hkv, M, D),
                     detail::head_view(dv.data(), B, Hkv, M, Dv), {}, detail::head_view<const float>(dctx, B, H, N, Dv),
                     detail::head_view(q_data, B, H, N, D), detail::head_view(k_data, B, Hkv, M, D),
                     detail::head_view(v_data, B, Hkv, M, Dv), detail::head_view(c.ctx.data(), B, H, N, Dv),
                     c.lse.view(), options);

  if (!cf.parameter_free) {
    projection_grads(g, "w_q", "b_q", cf.bias, c.x.data(), dq.data(), rows, E, H * D, options.num_threads);
    projection_grads(g, "w_k", "b_k", cf.bias, kv_in, dk.data(), kv_rows, E, Hkv * D, options.num_threads);
    projection_grads(g, "w_v", "b_v", cf.bias, kv_in, dv.data(), kv_rows, E, Hkv * Dv, options.num_threads);
  }
  if (dx) *dx = rows_tensor(c.batched, B, N, E, "dx", std::move(*dx));
  if (dkv) *dkv = c.cross ? rows_tensor(c.batched, B, M, E, "dkv", std::move(*dkv)) : Tensor<float>();
  float* query_side = dx ? dx->data() : nullptr;
  float* key_side = c.cross ? (dkv ? dkv->data() : nullptr) : query_side;
  // Parameter-free: q = x and k = v = kv, so their gradients add up directly.
  if (cf.parameter_free) {
    if (query_side)
      for (int64_t i = 0; i < rows * E; ++i) query_side[i] = dq[i];
    if (key_side)  // self-attention adds to dq; dkv (cross) holds whatever it held
      for (int64_t i = 0; i < kv_rows * E; ++i) key_side[i] = (c.cross ? 0.0f : key_side[i]) + dk[i] + dv[i];
    return;
  }
  if (query_side) input_grad(query_side, dq.data(), w_q, rows, false, options.num_threads);
  if (key_side) {
    input_grad(key_side, dk.data(), w_k, kv_rows, !c.cross, options.num_threads);
    input_grad(key_side, dv.data(), w_v, kv_rows, true, options.num_threads);
  }
  if (query_side && cf.residual)
    for (int64_t i = 0; i < rows * E; ++i) query_side[i] += dy_rows[i];
}

}  // namespace qkv
