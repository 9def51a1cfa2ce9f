// The fused attention backward's internal interface (the params are in params.h): the unit of
// work (one chunk of query rows of one kv-head group), the layout of a task's scratch, one task
// function per SIMD family (<isa>/backward.cpp, all instantiating backward_tile.h), and the driver
// (backward.cpp), which plans the chunks, runs the tasks on threads and sums their partials.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "kernels/large_scores_room.h"
#include "kernels/params.h"

namespace qkv::kernels {

// Query rows and keys per tile of the backward. Every family uses the same tiles, so a task's
// summation order depends on the shape alone.
constexpr int64_t kBackwardTile = 64;
// Padding of the packed rows (the widest family's lanes); scratch is sized with it.
constexpr int64_t kBackwardPad = 16;
// |lse| past which the backward rebuilds a row's max and normalizer from its logits
// (backward_renorm.h) instead of P = exp(logit − lse): there the rounding of lse (half an ulp of
// |lse|, relative, in every P) passes 2^-14 for an fp32 lse and 2^-24 for a float64 one. An
// fp32 lse below it carries the error of FlashAttention's own lse; a float64 one, none that shows.
constexpr double kRenormFloat = 0x1p10, kRenormWide = 0x1p29;

// Whether a row's own lse (its max + the log of its sum, in double) is the `given` one, to that
// lse's precision (4 ulps of its type: double if `wide`, else float) and the forward's fp32 sums
// (0.01). An lse from elsewhere (-1e30 for a row whose own is 0.5) is not, and stays the caller's.
inline bool same_row_lse(double own, double given, bool wide) {
  const double a = std::abs(given);
  const double ulp =
      wide ? std::nextafter(a, INFINITY) - a : double{std::nextafter(static_cast<float>(a), INFINITY)} - a;
  return std::abs(own - given) <= 0.01 + 4.0 * ulp;
}

// Query rows [chunk * chunk_rows, ...) of every query head of kv head hk of batch row b.
struct BackwardTask {
  int64_t b = 0, hk = 0, chunk = 0;
};

// Where a task's buffers sit in its per-thread scratch (offsets in floats, each 64-byte aligned
// when the scratch is). Row widths are padded to kBackwardPad, enough for every family.
struct BackwardLayout {
  explicit BackwardLayout(const BackwardParams& p) {
    const AttentionShape& s = p.shape;
    const int64_t t = kBackwardTile, rows = p.chunk_rows;
    const int64_t dp = pad(s.D), dvp = pad(s.Dv);
    int64_t at = 0;
    auto take = [&at](int64_t n) {
      const int64_t o = at;
      at += pad(n);
      return o;
    };
    q = take(rows * dp), dout = take(rows * dvp), dq = take(rows * dp), row_dot = take(rows), q_sizes = take(rows);
    dominant = take(2 * rows), dominant_cap = take(rows), others = take(2 * rows);
    row_dot_wide = take(2 * rows), margin = take(rows), separates = take(rows / t + 1);
    renorm = take(rows / 4 + 1), norm_max = take(rows), norm_log = take(2 * rows);
    k_sizes = take(s.M);
    const int64_t keys = p.chunk_key_rows;
    dk = take(keys * dp), dv = take(keys * dvp);
    const bool grouped = s.H > s.Hkv;
    dk_head = take(grouped ? keys * dp : 0), dv_head = take(grouped ? keys * dvp : 0);
    kt = take(p.key_group * dp * t), vt = take(p.key_group * dvp * t), k = take(p.key_group * t * dp);
    s_ = take(t * t), ds = take(t * t), dcap = take(t * t), ones = take(t), iota = take(t);
    wide = take(2 * refine_room(s.D)), s_lo = take(t * t), zeros = take(std::max(dp, dvp));
    total = at + 64;  // vector loads of a tail may read (never use) past the last element
  }
  static int64_t pad(int64_t n) { return (n + kBackwardPad - 1) / kBackwardPad * kBackwardPad; }
  // Buffers of one head's chunk: packed q, dout, the dq sums, D = rowsum(dout ∘ out), and
  // |q| of each row; |k| of each key (both for large_scores.h, when its gate passes).
  int64_t q = 0, dout = 0, dq = 0, row_dot = 0, q_sizes = 0, k_sizes = 0;
  // Per chunk row, for backward_tile.h's deferred dominant key: the key (int64), softcap's
  // derivative there, and the sum of the other keys' dS (double).
  int64_t dominant = 0, dominant_cap = 0, others = 0;
  int64_t row_dot_wide = 0;  // D per chunk row in double, for large q
  // For large q: near_max_margins' margin per chunk row, and per query tile of the chunk whether
  // its scores separate (int8: 0 not known yet, 1 yes, -1 no), for backward_tile.h's screen.
  int64_t margin = 0, separates = 0;
  // Per chunk row, for backward_renorm.h: whether it is renormalized (int8), its logits' max
  // (float) and the log of its normalizer (double).
  int64_t renorm = 0, norm_max = 0, norm_log = 0;
  // The dk, dv sums of every key over the task (all heads of the group), and of one head of a
  // group (H > Hkv only): each head's sum is added to the group's whole, as PyTorch sums a
  // repeated k, v, so a long running sum over every head does not lose the later heads' bits.
  int64_t dk = 0, dv = 0, dk_head = 0, dv_head = 0;
  // Key tile buffers of each key tile of a group: kᵀ, vᵀ and k rows.
  int64_t kt = 0, vt = 0, k = 0;
  // Tile pair buffers: S then P, dP then dS, softcap's derivative; constants 1 and 0, 1, 2, ...
  int64_t s_ = 0, ds = 0, dcap = 0, ones = 0, iota = 0, zeros = 0;
  // kᵀ of a key tile and rows of q widened to double for large_scores.h's second sum, and the low
  // parts of the scores it writes.
  int64_t wide = 0, s_lo = 0;
  int64_t total = 0;
};

using BackwardFn = void (*)(const BackwardParams&, const BackwardTask&, float* scratch);

// Computes one task; every family computes the same function (only rounding differs).
void backward_tile_avx512(const BackwardParams& p, const BackwardTask& task, float* scratch);
void backward_tile_avx2(const BackwardParams& p, const BackwardTask& task, float* scratch);
void backward_tile_scalar(const BackwardParams& p, const BackwardTask& task, float* scratch);
void backward_tile_neon(const BackwardParams& p, const BackwardTask& task, float* scratch);  // AArch64 only

// Runs the whole backward on `num_threads` threads with the given SIMD family. The caller sets p's
// inputs, out, lse, dout and outputs (dk, dv and dbias also as views); plan, partial sums, bands
// and scratch are the driver's. Returns false when a task or a partial sum wrote an inf or NaN
// gradient: the caller names the cause. Throws qkv::Interrupted on a stop request.
[[nodiscard]] bool backward(BackwardParams p, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                            Simd path, int num_threads);

}  // namespace qkv::kernels
