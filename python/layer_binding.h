// The Python object behind qkv.MultiHeadAttention: the C++ layer plus what the last training-mode
// forward() left for backward() and the gradients backward() produced. Shared with explain.cpp.
#pragma once

#include <map>
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

// What one Python thread's forward() left for its backward(), and the gradients its backward()
// produced.
struct ThreadState {
  std::shared_ptr<const ForwardState> last;
  qkv::TensorMap grads;
};

// Thread-safety contract: forward/backward state and .grads are per calling thread (a layer shared
// by threads never hands one thread's forward to another's backward); the weights are shared.
// Every member is touched only with the GIL held.
struct PyLayer {
  explicit PyLayer(qkv::MultiHeadAttention l) : layer(std::move(l)) {}
  qkv::MultiHeadAttention layer;
  bool training = true;

  // The calling thread's state (created on first use). Entries of threads that have ended are
  // dropped whenever a new thread first uses the layer, so they do not pile up.
  ThreadState& mine();
  qkv::TensorMap& grads() { return mine().grads; }

 private:
  std::map<uint64_t, ThreadState> threads_;  // by the Python thread state's id
};

}  // namespace qkvpy
