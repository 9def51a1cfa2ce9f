// The parameters of the fused kernels, as flash-attention passes them: pointers plus element
// strides named by what they step over, so any stride order ([B,N,H,D] views included) costs
// nothing. The backward's params extend the forward's: the same inputs, plus the gradients.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "kernels/mask_eval.h"
#include "qkv/attention_options.h"
#include "qkv/interrupt.h"
#include "qkv/tensor.h"

namespace qkv::kernels {

// Element strides of a [batch, head, row, col] tensor (lse: [batch, head, row], col unused).
struct Strides {
  int64_t batch = 0, head = 0, row = 0, col = 1;
  int64_t at(int64_t b, int64_t h, int64_t i) const { return b * batch + h * head + i * row; }
};

// The strides of a rank-3 or rank-4 view (an empty view: all zero).
template <class T>
Strides strides_of(const TensorView<T>& t) {
  if (t.empty()) return Strides{0, 0, 0, 0};
  return Strides{t.stride(0), t.stride(1), t.stride(2), t.rank() > 3 ? t.stride(3) : 1};
}

enum class InputType { f32, bf16 };

// q: [B,H,N,D], k: [B,Hkv,M,D], v: [B,Hkv,M,Dv] of `dtype` -> out: [B,H,N,Dv], lse: [B,H,N]
// (lse may be null).
struct ForwardParams {
  AttentionShape shape;
  InputType dtype = InputType::f32;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  Strides q_stride, k_stride, v_stride, out_stride, lse_stride;
  float* out = nullptr;
  float* lse = nullptr;
  // lse in float64 instead of lse (exactly one is set when lse is wanted): the row's m + log(l)
  // without a final rounding to fp32, which at |lse| ~ 100 (scores of q·50) is up to 3.8e-6 and
  // becomes a relative error of every P the backward recomputes from it.
  double* lse_wide = nullptr;
  float scale = 1.0f;
  const detail::MaskEval* mask = nullptr;
  // Which weights to drop (dropout.active()), and 1 / (1 − p) rounded to fp32 for the kept ones.
  Dropout dropout;
  float dropout_scale = 1.0f;
  // Query rows per tile: chosen from the shape alone, never from the thread count, so the
  // reduction order (and so every bit of the result) does not depend on the threads.
  int64_t tile_rows = 64;
  // Tiles per task, run block by block together so they share each K/V block in cache; also
  // from the shape alone.
  int64_t tile_group = 1;
  // Keys per block of the fp32 products (fp32_key_block, dispatch.h, set by kernels::forward),
  // capped by the family's Ops::kKeyBlock; bf16 pairs take the family's. One value for the whole
  // call, so the blocks (and so the bits) do not depend on the threads.
  int64_t key_block = 128;
  // bf16 inputs: multiply pairs with vdpbf16ps (AVX512_BF16) instead of widening to fp32.
  bool bf16_dot = false;
  // bf16_dot with both products on AMX tiles (AMX-BF16; D a multiple of 32, Dv of 16).
  bool bf16_amx = false;
  // [B, Hkv]: each kv head's bound of |k| (large_scores.h), NaN until the first task of that head
  // computes it (every task would get the same value; computed per task it made a long sliding
  // window quadratic in M). Written through std::atomic_ref. Null: computed per task.
  float* k_bounds = nullptr;
  // Set (if not null) when a row that has an allowed key comes out with a non-finite out or lse:
  // the caller then tells an fp32 overflow from non-finite inputs. Only ever set to true.
  std::atomic<bool>* nonfinite = nullptr;
  // Set (if not null) when a row that has an allowed key comes out with every score -inf (l = 0):
  // a -inf bias or keep-mask zeros over the whole row, or scores below -3.4e38 from finite inputs,
  // which the caller tells apart. Only ever set to true.
  std::atomic<bool>* emptied = nullptr;

  bool is_bf16() const { return dtype == InputType::bf16; }
  template <class T>
  static const T* typed(const void* p) {
    return static_cast<const T*>(p);
  }
};

// The forward's inputs with their strides, scale and mask: what the forward and the backward
// params share. The caller sets out and lse.
template <class T>
ForwardParams forward_params(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             const AttentionShape& s, const AttentionOptions& options, const detail::MaskEval& mask) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>);
  ForwardParams p;
  p.shape = s;
  p.dtype = std::is_same_v<T, bf16> ? InputType::bf16 : InputType::f32;
  p.q = q.data(), p.k = k.data(), p.v = v.data();
  p.q_stride = strides_of(q), p.k_stride = strides_of(k), p.v_stride = strides_of(v);
  p.scale = static_cast<float>(attention_scale(options.scale, s.D));
  p.mask = &mask;
  p.dropout = options.dropout;
  if (p.dropout.active()) p.dropout_scale = static_cast<float>(dropout_scale(p.dropout));
  return p;
}

// The forward's params (fp32 inputs; out and lse or lse_wide are read, not written), plus dout -> dq: [B,H,N,D],
// dk: [B,Hkv,M,D], dv: [B,Hkv,M,Dv], dbias: [B,H,N,M] (may be null). Query rows are split into
// `chunks` chunks of `chunk_rows` (a multiple of kBackwardTile). Chunk 0 writes dk and dv; chunk
// c > 0 writes its partial sums of the keys of chunk_keys to dk_part/dv_part [c-1, B, Hkv, M,
// D|Dv] (contiguous; the other keys' rows are never written nor read), which the driver adds to
// dk/dv in chunk order.
struct BackwardParams : ForwardParams {
  explicit BackwardParams(const ForwardParams& forward) : ForwardParams(forward) {}

  const float* dout = nullptr;
  Strides dout_stride, dq_stride, dk_stride, dv_stride, dbias_stride;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr, *dbias = nullptr;
  float *dk_part = nullptr, *dv_part = nullptr;
  const detail::KeyBand* bands = nullptr;  // [B, N], from mask->band
  // [B]: the keys some row of batch row b reads (the union of its rows' bands). As in the forward,
  // a key past it and a row whose band is empty are never read, so padding may hold anything.
  const detail::KeyBand* key_extents = nullptr;
  int64_t chunk_rows = 0, chunks = 1;
  // [chunks, B]: the key tiles the rows of chunk c of batch row b may see (their bands' union,
  // widened to whole kBackwardTile tiles, within M; lo >= hi when none). A chunk's dk and dv sums
  // are zero outside it, so its task clears, sums and writes only these keys.
  const detail::KeyBand* chunk_keys = nullptr;
  int64_t chunk_key_rows = 0;  // the most keys in one chunk_keys: the rows of a task's dk, dv sums
  int64_t key_group = 1;       // key tiles packed at once, each query tile visiting them in turn
  // Whether each task sees every key of its rows (off for detail::BackwardRows::partial, where the
  // ring hands a task one block of keys): then a row's gradients may use identities over the whole
  // row (backward_tile.h: a single key's dS is 0; a dominant key's dS is minus the others').
  bool whole_rows = true;
  // Checked between key groups: a task (all keys of a head) can take seconds. A stopped task leaves
  // its outputs partial; the caller then throws qkv::Interrupted. nullptr: never stops.
  InterruptScope* interrupt = nullptr;

  const float* qf() const { return typed<float>(q); }
  const float* kf() const { return typed<float>(k); }
  const float* vf() const { return typed<float>(v); }
};

}  // namespace qkv::kernels
