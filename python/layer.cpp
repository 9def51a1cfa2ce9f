// qkv.MultiHeadAttention: the learnable layer, with its weights visible to numpy in place.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <cmath>
#include <set>

#include "bare_new.h"
#include "bind_util.h"
#include "shared_reads.h"
#include "bindings.h"
#include "layer_binding.h"
#include "qkv/layer.h"

namespace qkvpy {
namespace {

using qkv::MultiHeadAttention;

constexpr const char* kParameterNames[] = {"w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"};

qkv::Tensor<float>& parameter(PyLayer& py_layer, const std::string& name) {
  MultiHeadAttention& layer = py_layer.layer;
  qkv::Tensor<float>* all[] = {&layer.w_q, &layer.w_k, &layer.w_v, &layer.w_o,
                               &layer.b_q, &layer.b_k, &layer.b_v, &layer.b_o};
  for (std::size_t i = 0; i < std::size(kParameterNames); ++i)
    if (name == kParameterNames[i]) return *all[i];
  throw py::value_error(fmt::format("no parameter named {}", name));
}

// A numpy view of a weight that keeps the layer alive; writes through it change the layer.
py::object get_parameter(py::object self, const std::string& name) {
  qkv::Tensor<float>& t = parameter(self.cast<PyLayer&>(), name);
  if (t.rank() == 0) return py::none();
  std::vector<py::ssize_t> dims(t.shape().begin(), t.shape().end());
  return py::array_t<float>(dims, t.data(), self);
}

// Copies into the existing buffer (never reallocates), so views handed out earlier stay valid.
void set_parameter(PyLayer& layer, const std::string& name, const py::object& value) {
  qkv::Tensor<float>& t = parameter(layer, name);
  if (t.rank() == 0)
    throw py::value_error(
        fmt::format("this layer has no {} (see its config: bias, output_projection, "
                    "parameter_free)",
                    name));
  py::array owner;
  const qkv::TensorView<const float> v = float32_view(value, name.c_str(), owner);
  qkv::require_shape(v.shape(), t.shape(), name);
  check_finite(v, name.c_str());
  const qkv::Tensor<float> copy = qkv::to_contiguous<float>(v);
  const SharedReads::Writing writing(&layer.layer);  // not under a forward, backward or save in another thread
  std::copy(copy.data(), copy.data() + copy.numel(), t.data());
}

// Arguments as given: a float size, a truthy string or bool for a flag or a size is refused by
// name (pybind11's own conversion took bias=1.5 as True and embed_dim=True as 1).
PyLayer make_layer(const py::object& embed_dim, const py::object& num_heads, const py::object& num_kv_heads,
                   const py::object& head_dim, const py::object& value_dim, const py::object& bias,
                   const py::object& output_projection, const py::object& parameter_free, const py::object& seed,
                   const py::object& residual) {
  auto optional_size = [](const py::object& obj, const char* name) {
    return obj.is_none() ? int64_t{0} : index_arg(obj, name);
  };
  qkv::LayerConfig c;
  c.embed_dim = index_arg(embed_dim, "embed_dim");
  c.num_heads = index_arg(num_heads, "num_heads");
  c.num_kv_heads = optional_size(num_kv_heads, "num_kv_heads");
  c.head_dim = optional_size(head_dim, "head_dim");
  c.value_dim = optional_size(value_dim, "value_dim");
  c.bias = flag_arg(bias, "bias");
  c.output_projection = flag_arg(output_projection, "output_projection");
  c.parameter_free = flag_arg(parameter_free, "parameter_free");
  c.residual = flag_arg(residual, "residual");
  c.seed = seed_arg(seed, "seed");
  return PyLayer(MultiHeadAttention(c));
}

}  // namespace

ThreadState& PyLayer::mine() {
  // A thread state's id is never reused, unlike threading.get_ident(): a thread that starts after
  // another ended must not find the dead thread's forward and gradients.
  PyThreadState* const self = PyThreadState_Get();
  const uint64_t me = PyThreadState_GetID(self);
  auto it = threads_.find(me);
  if (it != threads_.end()) return it->second;
  if (!threads_.empty()) {
    std::set<uint64_t> alive;
    for (PyThreadState* t = PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(self)); t != nullptr;
         t = PyThreadState_Next(t))
      alive.insert(PyThreadState_GetID(t));
    std::erase_if(threads_, [&](const auto& entry) { return alive.count(entry.first) == 0; });
  }
  return threads_[me];
}

namespace {

py::array forward(PyLayer& self, const py::object& x_obj, const py::object& kv_obj, const py::kwargs& kwargs) {
  const MultiHeadAttention& layer = self.layer;
  const CallOptions call = split_kwargs(kwargs, "forward");
  py::array x_owner, kv_owner;
  const qkv::TensorView<const float> x = float32_view(x_obj, "x", x_owner);
  qkv::TensorView<const float> kv;
  if (!kv_obj.is_none()) kv = float32_view(kv_obj, "kv", kv_owner);
  if (x.rank() != 2 && x.rank() != 3)
    throw py::value_error(fmt::format("x: expected [N, E] or [B, N, E], got shape {}", qkv::shape_string(x.shape())));
  if (!kv.empty() && kv.rank() != x.rank())
    throw py::value_error(
        fmt::format("kv {} must have the rank of x {}", qkv::shape_string(kv.shape()), qkv::shape_string(x.shape())));
  const int64_t B = x.rank() == 3 ? x.dim(0) : 1, N = x.dim(x.rank() - 2);
  const int64_t M = kv.empty() ? N : kv.dim(kv.rank() - 2);
  if (call.check_finite) {
    check_finite(x, "x");
    if (!kv.empty()) check_finite(kv, "kv");
  }
  auto state = std::make_shared<ForwardState>();
  state->mask = parse_mask(call.mask, B, layer.config().num_heads, N, M);
  state->options.mask = state->mask.mask;
  apply_options(call, state->options);
  // Read once, with the GIL: another thread or a signal handler may set it during the forward.
  const bool training = self.training;
  qkv::Tensor<float> out;
  {
    const SharedReads::Reading reading(&self.layer);  // weights change only between calls that read them
    InterruptibleRelease release;                     // Ctrl-C stops it
    out = layer.forward(x, kv, state->options, training ? &state->cache : nullptr);
  }
  self.mine().last = training ? std::move(state) : nullptr;
  return tensor_to_numpy(std::move(out));
}

py::object backward(PyLayer& self, const py::object& dy_obj) {
  const std::shared_ptr<const ForwardState> state = self.mine().last;
  if (!state)
    throw py::value_error("backward: no forward to go back through; call forward() first with training = True");
  py::array dy_owner;
  const qkv::TensorView<const float> dy = float32_view(dy_obj, "dout", dy_owner);
  qkv::TensorMap grads;
  qkv::Tensor<float> dx, dkv;
  {
    const SharedReads::Reading reading(&self.layer);
    InterruptibleRelease release;  // Ctrl-C stops it
    self.layer.backward(state->cache, dy, state->options, &grads, &dx, state->cache.cross ? &dkv : nullptr);
  }
  self.grads() = std::move(grads);
  if (state->cache.cross) return py::make_tuple(tensor_to_numpy(std::move(dx)), tensor_to_numpy(std::move(dkv)));
  return tensor_to_numpy(std::move(dx));
}

// The gradients of the last backward() as {name: float32 array} (copies, so a later backward()
// cannot change arrays the caller holds).
py::dict grads_of(const py::object& self) {
  py::dict out;
  for (auto& [name, t] : self.cast<PyLayer&>().grads()) {
    std::vector<py::ssize_t> dims(t.shape().begin(), t.shape().end());
    out[py::str(name)] = py::array_t<float>(dims, t.data(), self).attr("copy")();
  }
  return out;
}

constexpr const char* kClassDoc = R"(Multi-head attention layer: Q = X·W_q (+ b_q), K = Xkv·W_k, V = Xkv·W_v,
attention per head, heads concatenated, then ·W_o (+ b_o).

Weights use the row-vector convention: w_q is [E, H·D] and Q = X @ w_q, i.e. the transpose of
torch.nn.MultiheadAttention's in_proj_weight rows (w_q = in_proj_weight[:E].T, w_o =
out_proj.weight.T). Grouped-query attention when num_kv_heads < num_heads.

MultiHeadAttention(embed_dim, num_heads=1, num_kv_heads=None, head_dim=None, value_dim=None,
                   bias=False, output_projection=True, parameter_free=False, seed=0,
                   residual=False)
  num_kv_heads: key/value heads (default num_heads; must divide it).
  head_dim: D (default embed_dim // num_heads); value_dim: Dv (default head_dim).
  bias: adds b_q, b_k, b_v (and b_o with the output projection).
  output_projection: without it the output is the concatenated heads [.., H·Dv].
  parameter_free: Q = K = V = X, no weights (needs num_heads = 1).
  residual: the output is x + attention(x)·W_o (needs an output of width embed_dim).
  seed: weights are uniform in ±1/sqrt(fan_in) from this seed (the same on every platform);
        biases start at 0.
Raises ValueError for an inconsistent configuration.

Weights (.w_q, .w_k, .w_v, .w_o, .b_q, .b_k, .b_v, .b_o) are float32 numpy views of the layer's
own memory: writing into them changes the layer; assigning an array of the same shape copies it
in. A parameter the config does not have reads as None.

Thread safety: forward(), backward() and save() release the GIL, so threads sharing a layer run
them in parallel. What backward() uses and what .grads returns are per thread: each thread's
backward() goes through that thread's last training-mode forward(), and .grads (and
Optimizer.step() / clip_grad_norm() called from that thread) are that thread's last backward()'s
gradients. The weights are shared: assigning one (layer.w_q = ...) or Optimizer.step() waits
until no forward(), backward() or save() of the layer is running in another thread, and none
starts until the change is done, so each call sees the weights wholly before or wholly after
it. Writing into the numpy views in place (layer.w_q[...] = ...) is not guarded: like any numpy
array another thread reads, do that only while no other thread uses the layer.)";

constexpr const char* kForwardDoc = R"(forward(x, kv=None, **options) -> numpy.ndarray float32

x: [N, E] or [B, N, E] (float32, or float64 rounded to float32). kv: keys/values input [M, E] or
[B, M, E] for cross-attention (same rank as x); None for self-attention. Returns [N, output_dim]
or [B, N, output_dim].
options: the mask keywords of qkv.scaled_dot_product_attention (causal, causal_align,
key_lengths, query_lengths, window, keep_mask, bias, alibi_slopes, softcap; shapes in terms of
[B, num_heads, N, M]) and scale, kernel, num_threads, check_finite. An unknown keyword is a
TypeError; bad shapes or values raise ValueError.)";

constexpr const char* kBackwardDoc = R"(backward(dout) -> dx, or (dx, dkv) after a cross-attention forward

Backpropagates dout = dL/dy (the shape of the last forward()'s output) through the calling thread's
last forward()
(which must have run with training = True; same masks and options). Returns dL/dx (x's shape)
and, for cross-attention, dL/dkv; stores dL/d(parameter) in .grads by parameter name.
ValueError without a preceding forward or for a wrong dout shape.)";

}  // namespace

void bind_layer(py::module_& m) {
  py::class_<PyLayer> cls(m, "MultiHeadAttention", kClassDoc);
  refuse_bare_new(cls);
  cls.def(py::init(&make_layer), py::arg("embed_dim"), py::arg("num_heads") = 1, py::arg("num_kv_heads") = py::none(),
          py::arg("head_dim") = py::none(), py::arg("value_dim") = py::none(), py::arg("bias") = false,
          py::arg("output_projection") = true, py::arg("parameter_free") = false, py::arg("seed") = 0,
          py::arg("residual") = false, "Creates a layer with seeded random weights (see the class docstring).");
  cls.def("forward", &forward, py::arg("x"), py::arg("kv") = py::none(), kForwardDoc);
  cls.def("__call__", &forward, py::arg("x"), py::arg("kv") = py::none(), "Same as forward().");
  cls.def("backward", &backward, py::arg("dout"), kBackwardDoc);
  cls.def_property_readonly("grads", &grads_of,
                            "Gradients of the last backward() as {name: float32 array} (empty before the first).");
  cls.def_property(
      "training", [](const PyLayer& l) { return l.training; },
      [](PyLayer& l, const py::object& on) { l.training = flag_arg(on, "training"); },
      "If True (the default), forward() keeps what backward() needs (inputs, projections, lse) "
      "until the next forward(); set False for inference to keep no activations.");
  cls.def(
      "save",
      [](const PyLayer& l, const py::object& path) {
        const std::string p = path_arg(path, "path");
        const SharedReads::Reading reading(&l.layer);
        GilRelease release;
        l.layer.save(p);
      },
      py::arg("path"),
      "Writes the weights and config as a .safetensors file (atomically: a failure leaves no partial file).");
  cls.def_static(
      "load",
      [](const py::object& path) {
        const std::string p = path_arg(path, "path");
        GilRelease release;
        return PyLayer(MultiHeadAttention::load(p));
      },
      py::arg("path"),
      "Reads a layer written by save() (or a training checkpoint). OSError as open() raises for a file "
      "that cannot be opened (FileNotFoundError for a missing one); ValueError for a malformed file, a wrong "
      "shape or a non-finite weight.");
  cls.def(
      "parameters",
      [](py::object self) {
        py::dict out;
        for (const auto& [name, t] : self.cast<PyLayer&>().layer.parameters())
          out[py::str(name)] = get_parameter(self, name);
        return out;
      },
      "The parameters this layer has, as {name: float32 view}, in a fixed order (w_q, w_k, w_v, w_o, b_q, ...).");
  // pybind11 keeps a pointer to each docstring, so they live as long as the module.
  static std::vector<std::string> docs;
  docs.reserve(std::size(kParameterNames));
  for (const char* name : kParameterNames) {
    const std::string n = name;
    docs.push_back(
        fmt::format("{} as a float32 view of the layer's memory (None if the config has none); "
                    "assign an array of the same shape to replace it.",
                    name));
    cls.def_property(
        name, [n](py::object self) { return get_parameter(self, n); },
        [n](PyLayer& layer, const py::object& value) { set_parameter(layer, n, value); }, docs.back().c_str());
  }
  auto config_int = [&](const char* name, int64_t qkv::LayerConfig::*field, const char* doc) {
    cls.def_property_readonly(
        name, [field](const PyLayer& l) { return l.layer.config().*field; }, doc);
  };
  config_int("embed_dim", &qkv::LayerConfig::embed_dim, "E, the width of the input rows.");
  config_int("num_heads", &qkv::LayerConfig::num_heads, "H, query heads.");
  config_int("num_kv_heads", &qkv::LayerConfig::num_kv_heads, "Hkv, key/value heads.");
  config_int("head_dim", &qkv::LayerConfig::head_dim, "D, the query/key head width.");
  config_int("value_dim", &qkv::LayerConfig::value_dim, "Dv, the value head width.");
  cls.def_property_readonly(
      "bias", [](const PyLayer& l) { return l.layer.config().bias; }, "Has biases.");
  cls.def_property_readonly(
      "output_projection", [](const PyLayer& l) { return l.layer.config().output_projection; }, "Has W_o.");
  cls.def_property_readonly(
      "parameter_free", [](const PyLayer& l) { return l.layer.config().parameter_free; }, "Q = K = V = X.");
  cls.def_property_readonly(
      "seed", [](const PyLayer& l) { return l.layer.config().seed; }, "Init seed.");
  cls.def_property_readonly(
      "residual", [](const PyLayer& l) { return l.layer.config().residual; }, "Output = x + attention.");
  cls.def_property_readonly(
      "note", [](const PyLayer& l) { return l.layer.config().note; }, "How the layer was trained (saved with it).");
  cls.def_property_readonly(
      "output_dim", [](const PyLayer& l) { return l.layer.output_dim(); }, "Width of each output row.");
  cls.def("__repr__", [](const PyLayer& l) {
    const qkv::LayerConfig& c = l.layer.config();
    return fmt::format(
        "MultiHeadAttention(embed_dim={}, num_heads={}, num_kv_heads={}, head_dim={}, value_dim={}, "
        "bias={}, output_projection={}, parameter_free={}, residual={})",
        c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.value_dim, c.bias ? "True" : "False",
        c.output_projection ? "True" : "False", c.parameter_free ? "True" : "False", c.residual ? "True" : "False");
  });
}

}  // namespace qkvpy
