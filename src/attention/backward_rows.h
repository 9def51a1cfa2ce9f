// Internal: attention_backward for a call that holds only some of each row's keys (ring
// attention's blocks), or one sequence of a packed varlen call. What it needs beyond
// AttentionOptions stays out of the public struct.
#pragma once

#include <cstdint>
#include <string>

#include "attention/overflow.h"
#include "qkv/backward.h"

namespace qkv::detail {

struct BackwardRows {
  // The keys of this call are a part of each row's softmax, whose out and lse come from the whole
  // row. Turns off the shortcut that zeroes the gradient of a row with exactly one allowed key,
  // which is exact only when that key is the whole row.
  bool partial = false;
  // Who the caller called, and what it can do about an fp32 overflow (varlen's own).
  Caller caller = {};
  // This call's row i is row row0 + i of the caller's lse (a ring block's rows among the rank's),
  // or with `packed` column row0 + i of its packed [H, total_q] lse (varlen); messages name them so.
  int64_t row0 = 0;
  bool packed = false;

  // Row (b, h, i) of this call's lse as the caller indexes it.
  std::string lse_row(int64_t b, int64_t h, int64_t i) const;
};

void attention_backward_rows(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                             TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                             TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                             const AttentionOptions& options, BackwardRows rows);
void attention_backward_rows(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                             TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                             TensorView<const float> v, TensorView<const float> out, TensorView<const double> lse,
                             const AttentionOptions& options, BackwardRows rows);

}  // namespace qkv::detail
