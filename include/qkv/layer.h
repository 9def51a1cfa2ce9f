// MultiHeadAttention: the learnable layer. Q = X·W_q, K = Xkv·W_k, V = Xkv·W_v (the seeds'
// row-vector convention: W_q is [E, H·D]), attention per head, heads concatenated, then ·W_o
// (plus X itself with a residual config).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qkv/attention.h"
#include "qkv/tensor_map.h"
#include "qkv/tensor.h"

namespace qkv {

struct LayerConfig {
  int64_t embed_dim = 0;          // E, width of the input rows
  int64_t num_heads = 1;          // H
  int64_t num_kv_heads = 0;       // Hkv; 0 means H
  int64_t head_dim = 0;           // D; 0 means E / H
  int64_t value_dim = 0;          // Dv; 0 means D
  bool bias = false;              // b_q, b_k, b_v (and b_o if output_projection)
  bool output_projection = true;  // W_o [H·Dv, E]; without it the output is [.., H·Dv]
  // Q = K = V = X (seed 002): no parameters; requires H = 1 and D = Dv = E.
  bool parameter_free = false;
  // y = x + attention(x)·W_o: the layer learns what to add to each word's own row, so its output
  // stays a vector of the input's kind. Self-attention with W_o (or E = H·Dv) only.
  bool residual = false;
  uint64_t seed = 0;  // initialization: uniform ±1/sqrt(fan_in), biases 0
  // Free text saved with the weights (how the layer was trained); shown by the sentence commands.
  std::string note = {};
};

// What forward() keeps for a later backward pass (training). Filled by forward(.., cache), which
// reuses the buffers the cache already holds when their shapes fit: a loop that keeps one cache
// (and one gradient map) allocates none of them after its first step. backward() writes its own
// buffers (backward_*) into the cache, so one cache serves one thread at a time.
struct LayerCache {
  int64_t batch = 0, queries = 0, keys = 0;  // B, N, M
  bool batched = false;                      // x was [B, N, E] (else [N, E])
  bool cross = false;                        // keys/values came from a separate kv input
  Tensor<float> x, kv;                       // contiguous inputs; kv empty for self-attention
  Tensor<float> q, k, v;                     // [B, N, H·D], [B, M, Hkv·D], [B, M, Hkv·Dv]; empty when parameter-free
  Tensor<float> ctx;                         // attention output, heads concatenated: [B, N, H·Dv]
  Tensor<double> lse;                        // [B, H, N], float64 for the backward (attention_backward)
  // backward()'s scratch: dy in rows, the gradients of ctx, q, k and v. Not results.
  mutable Tensor<float> backward_dy, backward_dctx, backward_dq, backward_dk, backward_dv;
};

// Owns its weights (public so training, I/O and bindings reach them). forward() is const and
// thread-safe; changing weights while another thread runs forward() is not.
class MultiHeadAttention {
 public:
  // Checks the config (throws qkv::Error naming the bad field) and initializes the weights.
  explicit MultiHeadAttention(const LayerConfig& config);

  // The resolved config: num_kv_heads, head_dim and value_dim are filled in; parameter-free
  // layers report output_projection = false.
  const LayerConfig& config() const { return config_; }
  int64_t output_dim() const;

  // x: [B, N, E] or [N, E]; kv: [B, M, E] or [M, E] for cross-attention, or empty for
  // self-attention. Returns [B, N, output_dim()] (rank matching x). Throws qkv::Error on shapes.
  Tensor<float> forward(TensorView<const float> x, TensorView<const float> kv = {},
                        const AttentionOptions& options = {}) const;
  // The same, also filling `cache` (if not null) with what backward needs.
  Tensor<float> forward(TensorView<const float> x, TensorView<const float> kv, const AttentionOptions& options,
                        LayerCache* cache) const;

  // Backward through the forward that filled `cache` (call it with the same options): given
  // dy = dL/dy (the forward's output shape), writes dL/dparameter into `grads` by parameter name
  // (w_q, ..., b_o: the names and shapes of parameters(); replaced if present), and, when not null,
  // dx = dL/dx (x's shape) and dkv = dL/dkv (kv's shape; cross-attention only). Throws qkv::Error
  // on shapes. Thread-safe like forward().
  void backward(const LayerCache& cache, TensorView<const float> dy, const AttentionOptions& options, TensorMap* grads,
                Tensor<float>* dx = nullptr, Tensor<float>* dkv = nullptr) const;

  // The parameters the config has, by name (w_q, w_k, w_v, w_o, b_q, ...), in a fixed order.
  std::vector<std::pair<std::string, Tensor<float>*>> parameters();
  std::vector<std::pair<std::string, const Tensor<float>*>> parameters() const;

  // Saves/loads weights as safetensors with names w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o and the
  // config in the metadata; if `path` is an existing directory, as one <name>.npy per tensor
  // plus the same config in qkv_layer.json (each file written atomically; the old config is removed
  // first and the new one written last, and the .npy files of parameters this layer lacks are
  // removed, so a save that fails part way leaves a directory load() refuses, never one holding
  // another layer's tensors under a config). save() and load()
  // throw qkv::Error on a non-finite weight (nothing is written); load() also on a missing
  // tensor, a wrong shape or a parameter the config does not have. Other tensor names and
  // metadata entries are ignored, so a file that adds its own to metadata() (a training
  // checkpoint) loads as a layer.
  void save(const std::string& path) const;
  static MultiHeadAttention load(const std::string& path);
  // Every file name save() may write into a directory, whatever the config: <name>.npy for each
  // parameter a layer can have, and qkv_layer.json. A caller checks its other outputs against them.
  static std::vector<std::string> directory_files();
  // The config as the metadata entries save() writes (qkv.format, qkv.embed_dim, ...).
  std::map<std::string, std::string> metadata() const;

  // [E, H·D], [E, Hkv·D], [E, Hkv·Dv], [H·Dv, E_out]; biases [H·D], [Hkv·D], [Hkv·Dv], [E_out].
  // Empty when the config has no such parameter.
  Tensor<float> w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;

 private:
  LayerConfig config_;
};

}  // namespace qkv
