// fp32 attention backward, FlashAttention-2 style: P is recomputed tile by tile from q, k and the
// forward's lse, so no N×M buffer exists. Two passes keep every sum inside one task (bitwise the
// same for any thread count): pass 1 owns (b, kv head, key tile) and sums dK, dV over all query
// heads of the group and all query tiles; pass 2 owns (b, head, query tile) and sums dQ over key
// tiles, recomputing P and dP. Masks go through MaskEval, exactly as in the forward.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backward_checks.h"
#include "backward_tiles.h"
#include "mask_eval.h"
#include "qkv/backward.h"

namespace qkv {
namespace {

constexpr int64_t kBr = 64;  // query rows per tile
constexpr int64_t kBc = 64;  // keys per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Problem {
  Problem(const AttentionOptions& options, const AttentionShape& shape) : s(shape), mask(options.mask, shape) {}
  AttentionShape s;
  detail::MaskEval mask;
  float scale = 1.0f, cap = 0.0f;
  bool elementwise = false;
  int64_t group = 1;
  TensorView<const float> q, k, v, dout, lse;
  TensorView<float> dbias;
  std::vector<detail::KeyBand> bands;  // [B, N]: keys each query may see
  std::vector<float> row_dot;          // [B, H, N]: D_i = dout_i · out_i

  const detail::KeyBand& band(int64_t b, int64_t i) const { return bands[b * s.N + i]; }
  // True if some row of [i0, i0 + rows) may see some key of [j0, j0 + cols).
  bool tiles_meet(int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols) const {
    for (int64_t i = i0; i < i0 + rows; ++i) {
      const detail::KeyBand& kb = band(b, i);
      if (!kb.empty() && kb.lo < j0 + cols && kb.hi > j0) return true;
    }
    return false;
  }
};

// Per-thread scratch, allocated before the parallel region so nothing inside it can throw.
struct Tiles {
  explicit Tiles(const AttentionShape& s)
      : q(kBr * s.D), dout(kBr * s.Dv), k(kBc * s.D), kt(s.D * kBc), vt(s.Dv * kBc), p(kBr * kBc), dp(kBr * kBc),
        dcap(kBr * kBc), acc_q(kBr * s.D), acc_k(kBc * s.D), acc_v(kBc * s.Dv), lse(kBr), row_dot(kBr) {}
  std::vector<float> q, dout, k, kt, vt, p, dp, dcap, acc_q, acc_k, acc_v, lse, row_dot;
};

// Loads the query side of a tile: q, dout, lse and D for rows [i0, i0 + rows) of head h.
void load_query_tile(const Problem& pr, int64_t b, int64_t h, int64_t i0, int64_t rows, Tiles& t) {
  detail::pack_rows(t.q.data(), pr.s.D, pr.q, b, h, i0, rows, pr.s.D);
  detail::pack_rows(t.dout.data(), pr.s.Dv, pr.dout, b, h, i0, rows, pr.s.Dv);
  for (int64_t r = 0; r < rows; ++r) {
    t.lse[r] = pr.lse(b, h, i0 + r);
    t.row_dot[r] = pr.row_dot[(b * pr.s.H + h) * pr.s.N + i0 + r];
  }
}

// p: [rows, kBc] holds q·kᵀ on entry and P = exp(logit - lse) on exit (0 where masked); dcap
// receives softcap's derivative d logit / d(scaled score) when softcap is on.
void tile_probabilities(const Problem& pr, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                        Tiles& t) {
  for (int64_t r = 0; r < rows; ++r) {
    float* prow = t.p.data() + r * kBc;
    float* crow = t.dcap.data() + r * kBc;
    const int64_t i = i0 + r;
    const detail::KeyBand& kb = pr.band(b, i);
    const float lse = t.lse[r];
    // A row whose lse is -inf had no allowed key: its P is 0, not exp(-inf + inf).
    const bool live = !kb.empty() && lse != kNegInf;
    const int64_t lo = live ? std::clamp<int64_t>(kb.lo - j0, 0, cols) : 0;
    const int64_t hi = live ? std::clamp<int64_t>(kb.hi - j0, lo, cols) : 0;
    for (int64_t c = 0; c < lo; ++c) prow[c] = 0.0f;
    for (int64_t c = hi; c < cols; ++c) prow[c] = 0.0f;
    if (!pr.elementwise) {
      for (int64_t c = lo; c < hi; ++c) prow[c] = std::exp(prow[c] * pr.scale - lse);
      continue;
    }
    for (int64_t c = lo; c < hi; ++c) {
      const float x = prow[c] * pr.scale;
      prow[c] = std::exp(pr.mask.adjust(x, b, h, i, j0 + c) - lse);
      if (pr.cap > 0) {
        const float th = std::tanh(x / pr.cap);
        crow[c] = 1.0f - th * th;
      }
    }
  }
}

// dp: [rows, kBc] holds dout·vᵀ on entry and dL/dlogit = P ∘ (dP − D) on exit.
void tile_logit_grads(int64_t rows, int64_t cols, Tiles& t) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* prow = t.p.data() + r * kBc;
    float* drow = t.dp.data() + r * kBc;
    const float dot = t.row_dot[r];
    for (int64_t c = 0; c < cols; ++c) drow[c] = prow[c] * (drow[c] - dot);
  }
}

// Turns dL/dlogit into dL/d(scaled score) by softcap's chain rule (a no-op without softcap).
void tile_through_softcap(const Problem& pr, int64_t rows, int64_t cols, Tiles& t) {
  if (pr.cap <= 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    float* drow = t.dp.data() + r * kBc;
    const float* crow = t.dcap.data() + r * kBc;
    for (int64_t c = 0; c < cols; ++c)
      if (drow[c] != 0.0f) drow[c] *= crow[c];  // dcap is only set inside the band
  }
}

// Steps shared by both passes for one (query tile, key tile) pair, with kt and vt packed: fills
// t.p with P and t.dp with dL/dlogit.
void tile_forward_and_dp(const Problem& pr, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                         Tiles& t) {
  const AttentionShape& s = pr.s;
  // p = q · kᵀ: [rows, D] · [D, cols]
  detail::tile_gemm(t.p.data(), kBc, t.q.data(), s.D, 1, t.kt.data(), kBc, rows, cols, s.D, false);
  tile_probabilities(pr, b, h, i0, rows, j0, cols, t);
  // dp = dout · vᵀ: [rows, Dv] · [Dv, cols]
  detail::tile_gemm(t.dp.data(), kBc, t.dout.data(), s.Dv, 1, t.vt.data(), kBc, rows, cols, s.Dv, false);
  tile_logit_grads(rows, cols, t);
}

// Pass 1 task. k, v: [B, Hkv, M, D|Dv] -> dk, dv rows [j0, j0 + kBc) of kv head hk.
void key_tile_backward(const Problem& pr, int64_t b, int64_t hk, int64_t j0, TensorView<float> dk,
                       TensorView<float> dv, Tiles& t) {
  const AttentionShape& s = pr.s;
  const int64_t cols = std::min(kBc, s.M - j0);
  detail::pack_cols(t.kt.data(), kBc, pr.k, b, hk, j0, cols, s.D);
  detail::pack_cols(t.vt.data(), kBc, pr.v, b, hk, j0, cols, s.Dv);
  std::fill(t.acc_k.begin(), t.acc_k.end(), 0.0f);
  std::fill(t.acc_v.begin(), t.acc_v.end(), 0.0f);
  for (int64_t h = hk * pr.group; h < (hk + 1) * pr.group; ++h) {
    for (int64_t i0 = 0; i0 < s.N; i0 += kBr) {
      const int64_t rows = std::min(kBr, s.N - i0);
      if (!pr.tiles_meet(b, i0, rows, j0, cols)) continue;
      load_query_tile(pr, b, h, i0, rows, t);
      tile_forward_and_dp(pr, b, h, i0, rows, j0, cols, t);
      // acc_v += pᵀ · dout: [cols, rows] · [rows, Dv]
      detail::tile_gemm(t.acc_v.data(), s.Dv, t.p.data(), 1, kBc, t.dout.data(), s.Dv, cols, s.Dv, rows, true);
      if (!pr.dbias.empty())
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) pr.dbias(b, h, i0 + r, j0 + c) = t.dp[r * kBc + c];
      tile_through_softcap(pr, rows, cols, t);
      // acc_k += dsᵀ · q: [cols, rows] · [rows, D]
      detail::tile_gemm(t.acc_k.data(), s.D, t.dp.data(), 1, kBc, t.q.data(), s.D, cols, s.D, rows, true);
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t d = 0; d < s.D; ++d) dk(b, hk, j0 + c, d) = pr.scale * t.acc_k[c * s.D + d];
    for (int64_t e = 0; e < s.Dv; ++e) dv(b, hk, j0 + c, e) = t.acc_v[c * s.Dv + e];
  }
}

// Pass 2 task. q: [B, H, N, D] -> dq rows [i0, i0 + kBr) of head h.
void query_tile_backward(const Problem& pr, int64_t b, int64_t h, int64_t i0, TensorView<float> dq, Tiles& t) {
  const AttentionShape& s = pr.s;
  const int64_t rows = std::min(kBr, s.N - i0), hk = h / pr.group;
  load_query_tile(pr, b, h, i0, rows, t);
  std::fill(t.acc_q.begin(), t.acc_q.end(), 0.0f);
  for (int64_t j0 = 0; j0 < s.M; j0 += kBc) {
    const int64_t cols = std::min(kBc, s.M - j0);
    if (!pr.tiles_meet(b, i0, rows, j0, cols)) continue;
    detail::pack_cols(t.kt.data(), kBc, pr.k, b, hk, j0, cols, s.D);
    detail::pack_cols(t.vt.data(), kBc, pr.v, b, hk, j0, cols, s.Dv);
    detail::pack_rows(t.k.data(), s.D, pr.k, b, hk, j0, cols, s.D);
    tile_forward_and_dp(pr, b, h, i0, rows, j0, cols, t);
    tile_through_softcap(pr, rows, cols, t);
    // acc_q += ds · k: [rows, cols] · [cols, D]
    detail::tile_gemm(t.acc_q.data(), s.D, t.dp.data(), kBc, 1, t.k.data(), s.D, rows, s.D, cols, true);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < s.D; ++d) dq(b, h, i0 + r, d) = pr.scale * t.acc_q[r * s.D + d];
}

// D_i = dout_i · out_i per row, in a fixed order. dout, out: [B, H, N, Dv].
std::vector<float> row_dots(TensorView<const float> dout, TensorView<const float> out, const AttentionShape& s) {
  std::vector<float> dots(static_cast<std::size_t>(s.B * s.H * s.N));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i) {
        float acc = 0.0f;
        for (int64_t e = 0; e < s.Dv; ++e) acc += dout(b, h, i, e) * out(b, h, i, e);
        dots[(b * s.H + h) * s.N + i] = acc;
      }
  return dots;
}

}  // namespace

void attention_backward(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                        TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                        const AttentionOptions& options) {
  const AttentionShape s = check_attention_shapes(q.shape(), k.shape(), v.shape(), options);
  detail::check_backward_outputs(s, dq.shape(), dk.shape(), dv.shape(), dbias, dout.shape());
  detail::check_shape(out.shape(), std::array<int64_t, 4>{s.B, s.H, s.N, s.Dv}, "out");
  detail::check_shape(lse.shape(), std::array<int64_t, 3>{s.B, s.H, s.N}, "lse");

  Problem pr(options, s);
  pr.scale = static_cast<float>(options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(s.D)));
  pr.cap = options.mask.softcap;
  pr.elementwise = pr.mask.has_elementwise();
  pr.group = s.H / s.Hkv;
  pr.q = q;
  pr.k = k;
  pr.v = v;
  pr.dout = dout;
  pr.lse = lse;
  pr.dbias = dbias;
  pr.bands.resize(static_cast<std::size_t>(s.B * s.N));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.N; ++i) pr.bands[b * s.N + i] = pr.mask.band(b, i);
  pr.row_dot = row_dots(dout, out, s);
  if (!dbias.empty())  // tiles that no query can see are never visited; their gradient is 0
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t i = 0; i < s.N; ++i)
          for (int64_t j = 0; j < s.M; ++j) dbias(b, h, i, j) = 0.0f;

  const int threads = options.num_threads > 0 ? options.num_threads : default_num_threads();
  std::vector<Tiles> scratch;
  scratch.reserve(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i) scratch.emplace_back(s);

  const int64_t key_tiles = (s.M + kBc - 1) / kBc, query_tiles = (s.N + kBr - 1) / kBr;
  const int64_t pass1 = s.B * s.Hkv * key_tiles, pass2 = s.B * s.H * query_tiles;
#pragma omp parallel num_threads(threads)
  {
    Tiles& t = scratch[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < pass1; ++task) {
      const int64_t jt = task % key_tiles, bh = task / key_tiles;
      key_tile_backward(pr, bh / s.Hkv, bh % s.Hkv, jt * kBc, dk, dv, t);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < pass2; ++task) {
      const int64_t it = task % query_tiles, bh = task / query_tiles;
      query_tile_backward(pr, bh / s.H, bh % s.H, it * kBr, dq, t);
    }
  }
}

}  // namespace qkv
