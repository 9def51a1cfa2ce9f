// Optimizers for named fp32 parameters (SGD with momentum, AdamW), global-norm gradient clipping
// and a warm-up + cosine learning-rate schedule. Gradients are a TensorMap keyed by parameter
// name, as MultiHeadAttention::backward produces them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "qkv/tensor_map.h"
#include "qkv/tensor.h"

namespace qkv {

// Parameters by name; the optimizer updates them in place (the caller keeps them alive).
using ParameterList = std::vector<std::pair<std::string, Tensor<float>*>>;

enum class OptimizerKind { sgd, adamw };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  // SGD (PyTorch's convention): g += weight_decay·p; buf = momentum·buf + g (buf = g on the first
  // step); p -= lr·buf. momentum = 0 is plain SGD.
  double momentum = 0.9;
  // AdamW: m = β1·m + (1-β1)·g, v = β2·v + (1-β2)·g², p -= lr·weight_decay·p (decoupled), then
  // p -= lr·m̂ / (sqrt(v̂) + eps) with bias-corrected m̂ = m/(1-β1^t), v̂ = v/(1-β2^t).
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
};

// Holds per-parameter state (zero at construction). Updates run in a fixed order in float64
// arithmetic per element, so results are bitwise reproducible. Not thread-safe.
class Optimizer {
 public:
  // Throws qkv::Error for a bad config (negative rates, betas outside [0, 1)).
  Optimizer(const OptimizerConfig& config, ParameterList params);

  // One update with learning rate lr. grads must hold every parameter's name with its shape
  // (extra names are ignored), all finite; throws qkv::Error otherwise, or when the update would
  // take a weight or a moment past float32's range, before changing anything.
  void step(const TensorMap& grads, double lr);

  // Updates done so far (AdamW's t).
  int64_t step_count() const { return steps_; }

  // The state tensors, for checkpoints: "sgd.momentum.<name>" or "adamw.m.<name>" and
  // "adamw.v.<name>". The views stay valid until the optimizer is destroyed.
  std::vector<std::pair<std::string, TensorView<const float>>> state() const;

  // Restores what state() returned and the step count; throws qkv::Error naming a missing or
  // misshapen tensor (leaving the optimizer unchanged).
  void load_state(const TensorMap& tensors, int64_t step_count);

 private:
  OptimizerConfig config_;
  ParameterList params_;
  std::vector<Tensor<float>> first_, second_;  // momentum or m; v (AdamW only)
  int64_t steps_ = 0;
};

// Scales every gradient by max_norm / norm when the global L2 norm over all of them exceeds
// max_norm (max_norm <= 0: never). Returns the norm before clipping (summed in float64 in name order).
// Throws qkv::Error for a NaN max_norm.
double clip_grad_norm(TensorMap& grads, double max_norm);

// Learning rate per step (counting from 0): linear warm-up from base/warmup to base over `warmup`
// steps, then cosine decay from base to min_lr, reaching min_lr at step `total`. With warmup >=
// total the run ends inside the warm-up: step total - 1 takes base·total/warmup, and the decay
// starts only past `warmup`. at() throws qkv::Error for a negative step, warmup or total, or
// unless 0 <= min_lr <= base, both finite.
struct LrSchedule {
  double base = 1e-3;
  double min_lr = 0.0;
  int64_t warmup = 0;
  int64_t total = 1;
  double at(int64_t step) const;
};

}  // namespace qkv
