// Attention backward: gradients of a loss L with respect to q, k, v (and the additive bias),
// given dout = dL/dout. Undoes attention_forward using its output and lse (no N×M memory).
#pragma once

#include "qkv/attention.h"

namespace qkv {

// dq [B,H,N,D], dk [B,Hkv,M,D], dv [B,Hkv,M,Dv] are overwritten (for GQA, dk/dv sum over the query
// heads of each group). dbias, if not empty, must be [B,H,N,M] and receives dL/dscores (= dL/dbias);
// the caller sums it over any dims it broadcast. Each gradient needs one place per element (no
// stride-0 dims) and memory of its own: one that shares bytes with an input or another gradient
// is refused with qkv::Error. out and lse are
// attention_forward's results for the same inputs. Fully masked rows contribute zero gradients. Deterministic for any
// thread count. options.kernel as in the forward: reference runs the float64 oracle
// (reference_attention_backward, which needs no out or lse, and refuses finite inputs whose scores
// or gradients overflow float64) and rounds each gradient once. Throws qkv::Error, as the forward
// does, when q, k, v, dout and out hold no NaN or inf (nor the bias a NaN or +inf) but a gradient
// came out inf or NaN (dout·v or a gradient's sum past 3.4e38, or on the reference kernel a
// gradient past float32's range), naming lse instead where a row's is not the forward's; the
// gradients are then unspecified. A NaN or +inf in lse, which no forward of finite inputs returns
// (a row's lse is finite, or -inf when it has no allowed key), is refused with qkv::Error naming
// the row, unless q, k, v or the bias hold NaN or inf themselves. What no row reads
// (keys past key_lengths or before every row's window, rows past query_lengths) may hold anything,
// inf and NaN included: it gets zero gradients and changes no other. A row whose lse is too large
// to hold its normalizer (|lse| past 2^10 here, past 2^29 in float64: every key under a bias of
// finfo.min) has its max and normalizer rebuilt from its own logits when they give that lse.
void attention_backward(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                        TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                        const AttentionOptions& options = {});

// The same with the float64 lse of attention_forward: P is then recomputed to fp32 accuracy at any
// score size, and the gradients meet FlashAttention's rule against PyTorch's fp32 composite with
// q scaled by 50 (tests/large_score_test.cpp). The recommended form when the caller keeps lse.
void attention_backward(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                        TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> out, TensorView<const double> lse,
                        const AttentionOptions& options = {});

}  // namespace qkv
