// The float64 reference attention, forward and backward: the oracles every fast path is tested against.
#pragma once

#include "qkv/attention.h"

namespace qkv {

// Computes attention in float64 exactly as defined in attention.h and mask.h, materializing one
// row of scores at a time. out [B,H,N,Dv] is written; lse [B,H,N] and weights [B,H,N,M] are
// written unless empty. Fully masked rows: out 0, weights 0, lse -inf. options.kernel is ignored.
// As in attention_forward, an output sharing memory with an input or another output is refused.
void reference_attention_forward(TensorView<double> out, TensorView<double> lse, TensorView<double> weights,
                                 TensorView<const double> q, TensorView<const double> k, TensorView<const double> v,
                                 const AttentionOptions& options = {});

// The float64 oracle of attention_backward (backward.h): recomputes everything from q, k, v in
// float64. options.kernel is ignored. Like the forward, throws qkv::Error when q, k, v and dout
// (and the bias) hold no NaN or inf but a score or gradient overflowed float64, rather than
// returning inf or NaN gradients.
void reference_attention_backward(TensorView<double> dq, TensorView<double> dk, TensorView<double> dv,
                                  TensorView<double> dbias, TensorView<const double> dout, TensorView<const double> q,
                                  TensorView<const double> k, TensorView<const double> v,
                                  const AttentionOptions& options = {});

}  // namespace qkv
