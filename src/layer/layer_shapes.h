// Shape checks and head views shared by the layer's forward and backward. Internal.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "qkv/layer.h"

namespace qkv::detail {

struct LayerDims {
  int64_t B = 0, N = 0, M = 0;
  bool batched = false, cross = false;
};

// The shape each parameter (w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, in that order) has under a
// resolved config; empty for one the config has none of. The one rule for the constructor and the
// checks below.
struct ParameterShape {
  const char* name;
  std::vector<int64_t> shape;
};
std::array<ParameterShape, 8> parameter_shapes(const LayerConfig& c);

// Throws qkv::Error "<what>: w_q has shape ... but the layer's config needs ..." for a parameter
// (a public member) assigned another shape: the products would read past it.
void check_parameter_shapes(const MultiHeadAttention& layer, std::string_view what);

// Checks x [N, E] or [B, N, E] and kv (empty, or [M, E] / [B, M, E] matching x's rank and B)
// against the config; throws qkv::Error naming the input.
LayerDims check_layer_inputs(const LayerConfig& config, TensorView<const float> x, TensorView<const float> kv);

// `t` itself if it has exactly `shape` (its values are about to be overwritten), else a new
// tensor of that shape: a loop that reuses one LayerCache allocates none of its buffers after the
// first step (each freed and allocated again, tens of MB a step faulted in afresh).
template <class T>
Tensor<T> reuse_or_new(Tensor<T>&& t, std::initializer_list<int64_t> shape, const char* what) {
  if (std::equal(t.shape().begin(), t.shape().end(), shape.begin(), shape.end())) return std::move(t);
  return Tensor<T>(shape, what);
}

// Whether any element of view `v` lies in t's storage.
bool overlaps(TensorView<const float> v, const Tensor<float>& t);

// A contiguous [B, rows, width] copy of a rank-2 or rank-3 view, into `into` when it has that
// shape; the caller makes sure `into` does not overlap t.
Tensor<float> contiguous_rows(TensorView<const float> t, int64_t B, int64_t rows, int64_t width, const char* what,
                              Tensor<float> into = {});

// Rows laid out [B, N, H, D] (one projected row per token, heads side by side) seen as
// [B, H, N, D] through strides, the layout attention_forward takes.
template <class T>
TensorView<T> head_view(T* data, int64_t B, int64_t H, int64_t N, int64_t D) {
  const std::array<int64_t, 4> shape{B, H, N, D}, strides{N * H * D, D, H * D, 1};
  return TensorView<T>(data, shape, strides);
}

}  // namespace qkv::detail
