// The Python object behind qkv.MultiHeadAttention: the C++ layer plus what the last training-mode
// forward() left for backward() and the gradients backward() produced. Shared with explain.cpp.
#pragma once

#include <memory>

#include "bind_util.h"
#include "qkv/io.h"
#include "qkv/layer.h"

namespace qkvpy {

// What backward() needs from the forward: the cache and the exact options (whose mask views
// borrow arrays held here). Shared, so a backward running without the GIL keeps it alive even if
// another thread's forward replaces it.
struct ForwardState {
  qkv::LayerCache cache;
  MaskArgs mask;
  qkv::AttentionOptions options;
};

struct PyLayer {
  explicit PyLayer(qkv::MultiHeadAttention l) : layer(std::move(l)) {}
  qkv::MultiHeadAttention layer;
  bool training = true;
  std::shared_ptr<const ForwardState> last;
  qkv::TensorMap grads;
};

}  // namespace qkvpy
