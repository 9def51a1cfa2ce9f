// Exact attention weights for chosen query rows, recomputed from q, k and the log-sum-exp of
// attention_forward, so the fused kernel never has to keep (or even form) the N x M weights.
// Letters as in attention.h; R is the number of chosen rows.
#pragma once

#include <cstdint>
#include <span>

#include "qkv/attention.h"

namespace qkv {

// weights [B,H,R,M] = softmax weights of query rows `rows` (indices into N; any order, repeats
// allowed): weights(b,h,r,j) = exp(score(b,h,rows[r],j) - lse(b,h,rows[r])) for allowed keys, 0
// for masked ones and for fully masked rows, with the masks and scale of `options` (the same
// semantics as attention_forward). Scores are computed in float64 from the fp32 inputs. lse
// [B,H,N] is attention_forward's; if empty, each row's lse is recomputed here in float64 (then a
// row sums to 1 within 1e-12). A NaN score makes its row's allowed weights NaN. Memory: O(M) per
// thread besides `weights`. Throws qkv::Error for inconsistent shapes or a row index outside
// [0, N). Thread-safe for distinct outputs; uses options.num_threads threads.
void attention_weights_rows(TensorView<float> weights, TensorView<const float> q, TensorView<const float> k,
                            TensorView<const float> lse, std::span<const int64_t> rows,
                            const AttentionOptions& options = {});

// The `topk` largest weights of each chosen row, largest first (ties: lower key index first):
// values [B,H,R,topk] and their key indices [B,H,R,topk]. Slots beyond a row's allowed keys
// hold value 0 and index -1. Same definitions, lse rule, errors and memory as
// attention_weights_rows; topk must be at least 1.
void attention_weights_topk(TensorView<float> values, TensorView<int64_t> indices, TensorView<const float> q,
                            TensorView<const float> k, TensorView<const float> lse, std::span<const int64_t> rows,
                            int64_t topk, const AttentionOptions& options = {});

}  // namespace qkv
