// Internal: attention_backward for a call that holds only some of each row's keys (ring
// attention's blocks). What it needs beyond AttentionOptions stays out of the public struct.
#pragma once

#include "qkv/backward.h"

namespace qkv::detail {

struct BackwardRows {
  // The keys of this call are a part of each row's softmax, whose out and lse come from the whole
  // row. Turns off the shortcut that zeroes the gradient of a row with exactly one allowed key,
  // which is exact only when that key is the whole row.
  bool partial = false;
};

void attention_backward_rows(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                             TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                             TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                             const AttentionOptions& options, BackwardRows rows);

}  // namespace qkv::detail
