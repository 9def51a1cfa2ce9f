#include "qkv/optim.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

namespace qkv {

namespace {
constexpr int64_t kMaxSteps = int64_t{1} << 62;
}  // namespace
namespace {

const Tensor<float>& find_same_shape(const TensorMap& map, const std::string& key, const Tensor<float>& like,
                                     const char* what) {
  const auto it = map.find(key);
  if (it == map.end()) throw Error(fmt::format("{}: no tensor named {}", what, key));
  if (!std::equal(it->second.shape().begin(), it->second.shape().end(), like.shape().begin(), like.shape().end()))
    throw Error(fmt::format("{}: {} has shape {} but the parameter is {}", what, key, shape_string(it->second.shape()),
                            shape_string(like.shape())));
  return it->second;
}

std::string first_name(OptimizerKind kind) { return kind == OptimizerKind::sgd ? "sgd.momentum." : "adamw.m."; }

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& config, ParameterList params)
    : config_(config), params_(std::move(params)) {
  const OptimizerConfig& c = config_;
  if (!(c.momentum >= 0 && c.momentum < 1))
    throw Error(fmt::format("optimizer: momentum {} is outside [0, 1)", c.momentum));
  if (!(c.beta1 >= 0 && c.beta1 < 1) || !(c.beta2 >= 0 && c.beta2 < 1))
    throw Error(fmt::format("optimizer: betas ({}, {}) must be in [0, 1)", c.beta1, c.beta2));
  if (!(c.eps > 0) || !(c.weight_decay >= 0) || !std::isfinite(c.eps) || !std::isfinite(c.weight_decay))
    throw Error(fmt::format("optimizer: eps {} must be finite and > 0, and weight decay {} finite and >= 0", c.eps,
                            c.weight_decay));
  for (const auto& [name, p] : params_) {
    first_.emplace_back(p->shape(), name);
    if (c.kind == OptimizerKind::adamw) second_.emplace_back(p->shape(), name);
  }
}

void Optimizer::step(const TensorMap& grads, double lr) {
  if (!std::isfinite(lr) || lr < 0) throw Error(fmt::format("optimizer: learning rate {} must be finite and >= 0", lr));
  if (!std::isfinite(lr * config_.weight_decay))
    throw Error(
        fmt::format("optimizer: learning rate {} times weight decay {} is not finite", lr, config_.weight_decay));
  // The moments were sized from the parameters at construction: one replaced since by a tensor of
  // another shape (a layer assigned a new config) would be stepped past its end.
  for (std::size_t k = 0; k < params_.size(); ++k) {
    const auto have = params_[k].second->shape(), had = first_[k].shape();
    if (!std::equal(have.begin(), have.end(), had.begin(), had.end()))
      throw Error(
          fmt::format("optimizer step: parameter {} has shape {} but had {} when the optimizer was made; "
                      "make a new optimizer for the new parameters",
                      params_[k].first, shape_string(have), shape_string(had)));
  }
  std::vector<const Tensor<float>*> g_of;
  for (const auto& [name, p] : params_) g_of.push_back(&find_same_shape(grads, name, *p, "optimizer step: gradients"));
  // A non-finite gradient (training diverged, or bad input) would turn every weight it touches
  // into NaN for good: refused before anything changes.
  for (std::size_t k = 0; k < params_.size(); ++k)
    for (int64_t i = 0; i < g_of[k]->numel(); ++i)
      if (!std::isfinite((*g_of[k])[i]))
        throw Error(
            fmt::format("optimizer step: gradient {} has a non-finite value ({}) at flat index {}; nothing "
                        "was updated (if training diverged, lower the learning rate)",
                        params_[k].first, (*g_of[k])[i], i));
  const OptimizerConfig& c = config_;
  const double wd = c.weight_decay;
  const int64_t t = steps_ + 1;
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(t));
  struct Next {
    double p, m, v;  // v: AdamW only
  };
  // Element i of parameter k after the step, in float64 (rounded to fp32 as it is stored).
  auto next = [&](std::size_t k, int64_t i) -> Next {
    const double p = (*params_[k].second)[i], m = first_[k][i], g = (*g_of[k])[i];
    if (c.kind == OptimizerKind::sgd) {
      const double gi = g + wd * p;
      const double buf = c.momentum == 0 ? gi : (t == 1 ? gi : c.momentum * m + gi);
      return {p - lr * buf, buf, 0.0};
    }
    const double mi = c.beta1 * m + (1.0 - c.beta1) * g;
    const double vi = c.beta2 * second_[k][i] + (1.0 - c.beta2) * g * g;
    double pi = p - lr * wd * p;
    pi -= lr * (mi / bc1) / (std::sqrt(vi / bc2) + c.eps);
    return {pi, mi, vi};
  };
  // A finite learning rate or gradient can still take a weight or a moment past float32's range:
  // it would be stored as inf for good. The whole step is computed once to check, before anything changes.
  auto fits = [](double x) { return std::isfinite(static_cast<float>(x)); };
  for (std::size_t k = 0; k < params_.size(); ++k)
    for (int64_t i = 0; i < first_[k].numel(); ++i) {
      const Next x = next(k, i);
      if (!fits(x.p) || !fits(x.m) || !fits(x.v))
        throw Error(
            fmt::format("optimizer step: learning rate {}{} takes {} past float32's range at flat index {} (weight {}, "
                        "moments {} and {}); nothing was updated (lower the learning rate{})",
                        lr, wd > 0 ? fmt::format(" with weight decay {}", wd) : "", params_[k].first, i, x.p, x.m, x.v,
                        wd > 0 ? " or the weight decay" : ""));
    }
  for (std::size_t k = 0; k < params_.size(); ++k)
    for (int64_t i = 0; i < first_[k].numel(); ++i) {
      const Next x = next(k, i);
      (*params_[k].second)[i] = static_cast<float>(x.p);
      first_[k][i] = static_cast<float>(x.m);
      if (c.kind == OptimizerKind::adamw) second_[k][i] = static_cast<float>(x.v);
    }
  steps_ = t;
}

std::vector<std::pair<std::string, TensorView<const float>>> Optimizer::state() const {
  std::vector<std::pair<std::string, TensorView<const float>>> out;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    out.emplace_back(first_name(config_.kind) + params_[k].first, first_[k].view());
    if (config_.kind == OptimizerKind::adamw) out.emplace_back("adamw.v." + params_[k].first, second_[k].view());
  }
  return out;
}

void Optimizer::load_state(const TensorMap& tensors, int64_t step_count) {
  // A count near INT64_MAX would wrap at the next step (and the bias corrections with it).
  if (step_count < 0 || step_count > kMaxSteps)
    throw Error(fmt::format("optimizer state: step count {} is outside [0, 2^62]", step_count));
  std::vector<const Tensor<float>*> src;
  std::vector<std::string> names;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    names.push_back(first_name(config_.kind) + params_[k].first);
    src.push_back(&find_same_shape(tensors, names.back(), first_[k], "optimizer state"));
    if (config_.kind == OptimizerKind::adamw) {
      names.push_back("adamw.v." + params_[k].first);
      src.push_back(&find_same_shape(tensors, names.back(), second_[k], "optimizer state"));
    }
  }
  // Moments that are not finite (or a negative second moment) would turn the weights into NaN at
  // the next step, which refuses such gradients: refused here too, before anything is copied.
  for (std::size_t i = 0; i < src.size(); ++i) {
    const bool second = config_.kind == OptimizerKind::adamw && i % 2 == 1;
    for (int64_t e = 0; e < src[i]->numel(); ++e) {
      const float x = (*src[i])[e];
      if (!std::isfinite(x) || (second && x < 0))
        throw Error(fmt::format("optimizer state: {} has {} at flat index {}; it must be finite{}", names[i], x, e,
                                second ? " and >= 0 (a second moment)" : ""));
    }
  }
  std::size_t s = 0;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    std::copy_n(src[s++]->data(), first_[k].numel(), first_[k].data());
    if (config_.kind == OptimizerKind::adamw) std::copy_n(src[s++]->data(), second_[k].numel(), second_[k].data());
  }
  steps_ = step_count;
}

double clip_grad_norm(TensorMap& grads, double max_norm) {
  if (std::isnan(max_norm)) throw Error("clip_grad_norm: max_norm is NaN (pass a number; <= 0 never clips)");
  double sum = 0.0;
  for (const auto& [name, g] : grads)
    for (int64_t i = 0; i < g.numel(); ++i) sum += double(g[i]) * double(g[i]);
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && norm > max_norm) {
    const double factor = max_norm / norm;
    for (auto& [name, g] : grads)
      for (int64_t i = 0; i < g.numel(); ++i) g[i] = static_cast<float>(g[i] * factor);
  }
  return norm;
}

double LrSchedule::at(int64_t step) const {
  if (step < 0 || warmup < 0 || total < 0)
    throw Error(fmt::format("lr schedule: step {}, warmup {} and total {} must be >= 0", step, warmup, total));
  if (!(std::isfinite(base) && std::isfinite(min_lr) && 0 <= min_lr && min_lr <= base))
    throw Error(
        fmt::format("lr schedule: need 0 <= min_lr <= base, both finite; got min_lr {}, base {}", min_lr, base));
  if (warmup > 0 && step < warmup) return base * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  const double progress = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  return min_lr + 0.5 * (base - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace qkv
