// Packed variable-length attention (FlashAttention's varlen form): a batch of sequences of
// different lengths stored end to end, with no padding and no work on padding.
//
// Sequence s owns query rows [cu_q[s], cu_q[s+1]) and key rows [cu_k[s], cu_k[s+1]); its queries
// attend to its own keys only. Per sequence, every option of attention_forward applies as if that
// sequence were a batch of one (causal in either alignment, window, ALiBi, softcap, scale, GQA,
// dropout with the sequence as its batch row); masks given per batch row or per element
// (key_lengths, query_lengths, keep, bias) are refused: sequences carry their own lengths.
#pragma once

#include <cstdint>
#include <span>

#include "qkv/attention.h"

namespace qkv {

// Offsets of packed sequences, checked: cu[0] = 0, non-decreasing, cu.back() = total rows.
// Throws qkv::Error naming `name` otherwise.
void check_cu_seqlens(std::span<const int64_t> cu, int64_t total, const char* name);

// q: [total_q, H, D], k: [total_k, Hkv, D], v: [total_k, Hkv, Dv] -> out: [total_q, H, Dv] and,
// if not empty, lse: [H, total_q] in float64 (as attention_forward_lse64). cu_q and cu_k have one
// entry more than there are sequences. A sequence with queries but no keys gives out 0, lse -inf.
// The same bits for any thread count. Throws qkv::Error for inconsistent shapes or offsets.
void varlen_attention_forward(TensorView<float> out, TensorView<double> lse, TensorView<const float> q,
                              TensorView<const float> k, TensorView<const float> v, std::span<const int64_t> cu_q,
                              std::span<const int64_t> cu_k, const AttentionOptions& options = {});

// Gradients of varlen_attention_forward, given dout [total_q, H, Dv] and the forward's out and lse:
// dq [total_q, H, D], dk [total_k, Hkv, D], dv [total_k, Hkv, Dv] are overwritten.
void varlen_attention_backward(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv,
                               TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                               TensorView<const float> v, TensorView<const float> out, TensorView<const double> lse,
                               std::span<const int64_t> cu_q, std::span<const int64_t> cu_k,
                               const AttentionOptions& options = {});

}  // namespace qkv
