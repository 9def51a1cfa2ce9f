// Internal: attention_forward made on behalf of another function (varlen's sequences, ring
// attention's blocks), whose overflow messages name that function and its remedy.
#pragma once

#include "attention/overflow.h"
#include "qkv/attention.h"

namespace qkv::detail {

void attention_forward_as(const Caller& caller, TensorView<float> out, TensorView<double> lse,
                          TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                          const AttentionOptions& options);
void attention_forward_as(const Caller& caller, TensorView<float> out, TensorView<float> lse, TensorView<const float> q,
                          TensorView<const float> k, TensorView<const float> v, const AttentionOptions& options);

}  // namespace qkv::detail
