// Typed attention masks. Each kind has one meaning and one polarity; all kinds combine (a key is
// allowed for a query only if every mask allows it). Shapes use the letters of attention.h.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

// Where the causal diagonal sits when N != M. top_left: query i sees keys j <= i.
// bottom_right: query i sees keys j <= i + (M_b - N_b), where M_b and N_b are the valid key and
// query lengths of batch row b (so the last query sees every key, as in decoding with a cache).
enum class CausalAlign { top_left, bottom_right };

// A band around the diagonal (the same diagonal that `causal_align` places): query i sees keys j
// with diag(i) - left <= j <= diag(i) + right. A negative bound means unbounded on that side, and
// so does any bound too large to matter (INT64_MAX included).
struct Window {
  int64_t left = -1;
  int64_t right = -1;
};

// Everything that can remove or reweight a (query, key) pair. Default-constructed: no masking.
// Views are borrowed: the caller keeps them alive for the duration of the call.
struct Mask {
  // Causal masking with the given diagonal alignment.
  std::optional<CausalAlign> causal;
  // Where the diagonal of `window` and ALiBi sits when causal is not set. Ignored if causal is set.
  CausalAlign diagonal = CausalAlign::top_left;
  std::optional<Window> window;
  // Valid keys per batch row: keys j >= key_lengths[b] are masked (variable-length batches). Size B.
  std::vector<int64_t> key_lengths;
  // Valid queries per batch row: rows i >= query_lengths[b] are fully masked (output 0). Size B.
  std::vector<int64_t> query_lengths;
  // Bool keep-mask, [B, H, N, M] with stride 0 on broadcast dims: nonzero = may attend.
  TensorView<const uint8_t> keep;
  // Additive float bias added to the scaled (and softcapped) scores, [B, H, N, M], stride 0 to
  // broadcast. -inf removes a pair.
  TensorView<const float> bias;
  // ALiBi: adds -slope[h] * |j - diag(i)| to the scores. Size H.
  std::vector<float> alibi_slopes;
  // If > 0, scores s become softcap * tanh(s / softcap) before bias and ALiBi are added.
  float softcap = 0.0f;
  // Added to the diagonal key index of every query of batch row b (causal, window, ALiBi), after
  // the alignment above. Size B, or empty for 0. Lets one block of a longer sequence keep the
  // diagonal of the whole (ring attention: query block at q0, key block at k0 gives q0 - k0).
  // Each within ±kMaxDiagonalOffset.
  std::vector<int64_t> diagonal_offsets;

  CausalAlign align() const { return causal ? *causal : diagonal; }
};

// The largest |diagonal offset| check_attention_shapes takes: past it an offset means nothing more
// (no sequence is that long), and the band's arithmetic would overflow int64.
constexpr int64_t kMaxDiagonalOffset = int64_t{1} << 60;

// Broadcasts a view of rank <= 4 to [B, H, N, M] by numpy rules (size-1 or missing dims get
// stride 0). Throws qkv::Error naming `what` if the shapes are not broadcast-compatible.
// For a bias (float; a TensorView<float> converts) and a keep mask (uint8).
TensorView<const float> broadcast_mask(TensorView<const float> view, int64_t B, int64_t H, int64_t N, int64_t M,
                                       const char* what);
TensorView<const uint8_t> broadcast_mask(TensorView<const uint8_t> view, int64_t B, int64_t H, int64_t N, int64_t M,
                                         const char* what);

}  // namespace qkv
