// qkv.Optimizer (SGD with momentum, AdamW) over a MultiHeadAttention's parameters, gradient
// clipping and the learning-rate schedule. The friendly constructors SGD() and AdamW() are in
// qkv/optim.py.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bare_new.h"
#include "bind_util.h"
#include "shared_reads.h"
#include "bindings.h"
#include "layer_binding.h"
#include "qkv/optim.h"

namespace qkvpy {
namespace {

// The optimizer updates the layer's tensors in place through pointers; the bound object keeps
// the layer alive (py::keep_alive) and the layer never reallocates them (setters copy in).
struct PyOptimizer {
  PyOptimizer(PyLayer& layer, const qkv::OptimizerConfig& config, double lr)
      : layer(layer), optimizer(config, layer.layer.parameters()), lr(lr) {}
  PyLayer& layer;
  qkv::Optimizer optimizer;
  double lr;
};

// A learning rate: a finite number >= 0 (inf was taken at construction and refused only by step()).
double lr_arg(const py::handle& obj) {
  const double lr = number_arg(obj, "lr");
  if (!(lr >= 0.0) || !std::isfinite(lr)) throw py::value_error(fmt::format("lr must be >= 0 and finite, got {}", lr));
  return lr;
}

qkv::TensorMap grads_from_dict(const py::dict& grads) {
  qkv::TensorMap map;
  for (const auto& [key, value] : grads) {
    const std::string name = string_arg(key, "a tensor name");
    py::array owner;
    map.emplace(name, qkv::to_contiguous<float>(float32_view(value, name.c_str(), owner)));
  }
  return map;
}

// A name the optimizer does not know is a caller's slip (a misspelt parameter would otherwise
// never be updated, or a state entry never restored), refused as PyTorch's strict load_state_dict
// does. The library takes larger maps (a checkpoint's tensors), so the rule is the binding's.
template <class Names>
void refuse_unknown_names(const qkv::TensorMap& map, const Names& known, const char* what) {
  for (const auto& entry : map) {
    const std::string& name = entry.first;
    if (std::ranges::none_of(known, [&](const auto& k) { return k.first == name; })) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k.first;
      throw py::value_error(fmt::format("{}: '{}' is not one of this optimizer's names ({})", what, name, list));
    }
  }
}

// Numbers as given: True is not a learning rate, '0.1' is not a number (pybind11 took both).
PyOptimizer make_optimizer(PyLayer& layer, const py::object& kind_obj, const py::object& lr_obj,
                           const py::object& momentum, const py::object& betas, const py::object& eps,
                           const py::object& weight_decay) {
  const std::string kind = string_arg(kind_obj, "kind");
  const double lr = lr_arg(lr_obj);
  if (!is_list_arg(betas) || py::len(betas) != 2)
    throw py::type_error(fmt::format("betas must be a pair (beta1, beta2), got {}", std::string(py::repr(betas))));
  qkv::OptimizerConfig c;
  if (kind == "sgd")
    c.kind = qkv::OptimizerKind::sgd;
  else if (kind == "adamw")
    c.kind = qkv::OptimizerKind::adamw;
  else
    throw py::value_error(fmt::format("kind must be 'sgd' or 'adamw', got '{}'", kind));
  c.momentum = number_arg(momentum, "momentum");
  c.beta1 = number_arg(betas[py::int_(0)], "betas[0]");
  c.beta2 = number_arg(betas[py::int_(1)], "betas[1]");
  c.eps = number_arg(eps, "eps");
  c.weight_decay = number_arg(weight_decay, "weight_decay");
  return PyOptimizer(layer, c, lr);
}

void step(PyOptimizer& self, const py::object& grads_obj, const py::object& lr) {
  const double rate = lr.is_none() ? self.lr : lr_arg(lr);
  if (!grads_obj.is_none() && !py::isinstance<py::dict>(grads_obj))
    throw py::type_error(
        fmt::format("grads must be a dict {{name: array}} or None, got {}", std::string(py::repr(grads_obj))));
  const std::optional<py::dict> grads =
      grads_obj.is_none() ? std::nullopt : std::optional<py::dict>(grads_obj.cast<py::dict>());
  if (grads) {
    const qkv::TensorMap map = grads_from_dict(*grads);
    refuse_unknown_names(map, self.layer.layer.parameters(), "step: grads");
    const SharedReads::Writing writing(&self.layer.layer);  // see the layer's "Thread safety"
    self.optimizer.step(map, rate);
    return;
  }
  if (self.layer.grads().empty())
    throw py::value_error("step: the layer has no gradients; call layer.backward() first or pass grads=");
  const SharedReads::Writing writing(&self.layer.layer);
  self.optimizer.step(self.layer.grads(), rate);
}

py::dict state_of(const PyOptimizer& self) {
  py::dict out;
  for (const auto& [name, view] : self.optimizer.state())
    out[py::str(name)] = tensor_to_numpy(qkv::to_contiguous<float>(view));
  return out;
}

constexpr const char* kOptimizerDoc = R"(An optimizer over a qkv.MultiHeadAttention's parameters.

Optimizer(layer, kind="adamw", lr=1e-3, momentum=0.9, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
  sgd   (PyTorch's convention): g += weight_decay·p; buf = momentum·buf + g; p -= lr·buf.
  adamw: decoupled weight decay p -= lr·weight_decay·p, then p -= lr·m̂/(sqrt(v̂) + eps).
Prefer qkv.SGD(layer, ...) and qkv.AdamW(layer, ...). Updates run in float64 per element and are
bitwise reproducible. ValueError for a bad config. Not thread-safe.)";

}  // namespace

void bind_optim(py::module_& m) {
  py::class_<PyOptimizer> cls(m, "Optimizer", kOptimizerDoc);
  refuse_bare_new(cls);
  cls.def(py::init(&make_optimizer), py::arg("layer"), py::arg("kind") = "adamw", py::arg("lr") = 1e-3,
          py::arg("momentum") = 0.9, py::arg("betas") = std::pair<double, double>(0.9, 0.999), py::arg("eps") = 1e-8,
          py::arg("weight_decay") = 0.0, py::keep_alive<1, 2>(), "See the class docstring.");
  cls.def("step", &step, py::arg("grads") = py::none(), py::arg("lr") = py::none(),
          "One update. grads: {name: array} for every parameter (default: layer.grads from the last "
          "backward()); lr: this step's rate (default: the optimizer's lr). ValueError for a missing or "
          "misshapen gradient, before anything changes.");
  cls.def_property(
      "lr", [](const PyOptimizer& o) { return o.lr; }, [](PyOptimizer& o, const py::object& lr) { o.lr = lr_arg(lr); },
      "The learning rate step() uses by default.");
  cls.def_property_readonly(
      "step_count", [](const PyOptimizer& o) { return o.optimizer.step_count(); }, "Updates done so far.");
  cls.def("state", &state_of, "The optimizer state as {name: float32 array} (copies), e.g. 'adamw.m.w_q'.");
  cls.def(
      "load_state",
      [](PyOptimizer& o, const py::dict& tensors, const py::object& step_count) {
        const qkv::TensorMap map = grads_from_dict(tensors);
        refuse_unknown_names(map, o.optimizer.state(), "load_state");
        o.optimizer.load_state(map, index_arg(step_count, "step_count"));
      },
      py::arg("state"), py::arg("step_count"), "Restores what state() returned and the step count.");

  m.def(
      "clip_grad_norm",
      [](PyLayer& layer, const py::object& max_norm) {
        return qkv::clip_grad_norm(layer.grads(), number_arg(max_norm, "max_norm"));
      },
      py::arg("layer"), py::arg("max_norm"),
      "Scales layer.grads (the last backward()'s gradients) so their global L2 norm is at most max_norm "
      "(max_norm <= 0: never). Returns the norm before clipping.");
  m.def(
      "lr_at",
      [](const py::object& step, const py::object& base, const py::object& min_lr, const py::object& warmup,
         const py::object& total) {
        return qkv::LrSchedule{number_arg(base, "base"), number_arg(min_lr, "min_lr"), index_arg(warmup, "warmup"),
                               index_arg(total, "total")}
            .at(index_arg(step, "step"));
      },
      py::arg("step"), py::arg("base") = 1e-3, py::arg("min_lr") = 0.0, py::arg("warmup") = 0, py::arg("total") = 1,
      "The learning rate at `step` (from 0): linear warm-up from base/warmup to base over `warmup` steps, then "
      "cosine decay to min_lr at step `total`.");
}

}  // namespace qkvpy
