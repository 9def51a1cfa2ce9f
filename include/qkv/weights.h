// Exact attention weights for chosen query rows, recomputed from q, k and the log-sum-exp of
// attention_forward, so the fused kernel never has to keep (or even form) the N x M weights.
// Letters as in attention.h; R is the number of chosen rows.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "qkv/attention.h"

namespace qkv {

// weights [B,H,R,M] = softmax weights of query rows `rows` (indices into N; any order, repeats
// allowed): weights(b,h,r,j) = exp(score(b,h,rows[r],j) - lse(b,h,rows[r])) for allowed keys, 0 for
// masked ones and for fully masked rows, with the masks and scale of `options` (the same semantics
// as attention_forward). Scores are computed in float64 from the fp32 inputs. lse [B,H,N] is
// attention_forward's; if empty, each row's lse is recomputed here in float64 (then a row sums to 1
// within 1e-12). A given lse past 2^10 in magnitude, whose float32 rounding would move every weight
// by more than 2^-14 (a row under a -1e9 mask: by 32), is replaced by the row's own where it is
// that row's to its precision, as attention_backward does. A NaN score makes its row's allowed
// weights NaN. Memory: O(M) per thread besides `weights`. Throws qkv::Error for inconsistent shapes
// or a row index outside [0, N), and, by attention_backward's rule for lse, for a chosen row's lse
// that is NaN or +inf (no forward of finite q, k and bias gives one; -inf reads as a fully masked
// row, as there) and for weights past float32's range from finite q, k and bias (an lse far below
// its row's, e.g. -1e30), for an output sharing memory with an
// input or itself, and (qkv::OutOfMemory) when a row of M float64 logits per thread cannot be
// allocated. Thread-safe for distinct outputs; uses options.num_threads threads.
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

// The largest weights of every query row, per head, found one row at a time: memory is
// O(M) per thread plus the result, never N×M.
struct TopKWeights {
  int64_t num_heads = 0, rows = 0, cols = 0, k = 0;  // H, N, M, min(top_k, M)
  std::vector<int32_t> index;  // [H, N, k] key positions, largest weight first (ties: lower index)
  std::vector<double> weight;  // [H, N, k] softmax weights
  std::vector<double> rest;    // [H, N] total weight of the keys outside the top k
};

// q [H, N, D], k [Hkv, M, D] (any strides, H % Hkv == 0, head h uses key head h / (H / Hkv)),
// through attention_weights_topk (weights.h): scores q·kᵀ·scale (default 1/√D) in float64, weights
// rounded to float. If `lse` [H, N] is given (the fused kernel's log-sum-exp, e.g. LayerCache::lse)
// the weights are exp(score − lse), the ones the fused path normalized; else each row is
// normalized in float64. Throws qkv::Error on shapes or top_k < 1.
TopKWeights attention_top_k(TensorView<const float> q, TensorView<const float> k, int64_t top_k,
                            std::optional<double> scale = {}, TensorView<const float> lse = {});

// One full row of weights (float-rounded, normalized in float64): head `head`, query `row` of
// q [H, N, D] against k [Hkv, M, D] (O(M) memory). Throws qkv::Error on shapes or an index out of range.
std::vector<double> attention_row(TensorView<const float> q, TensorView<const float> k, int64_t head, int64_t row,
                                  std::optional<double> scale = {});

}  // namespace qkv
