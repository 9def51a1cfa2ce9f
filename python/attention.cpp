// qkv._qkv.scaled_dot_product_attention: numpy in, numpy out. The public signature and docstring
// live in qkv/attention.py; this file converts arrays (zero-copy for float32 and float64, any
// strides), runs the kernel with the GIL released, and returns out (and lse).
#include <fmt/format.h>

#include "bind_util.h"
#include "bindings.h"
#include "qkv/attention.h"
#include "qkv/reference.h"

namespace qkvpy {
namespace {

template <class T>
py::object forward_as(const py::array& q, const py::array& k, const py::array& v, const AttentionCall& call,
                      bool return_lse, bool finite) {
  const qkv::TensorView<const T> qv = array_view<T>(q, "q"), kv = array_view<T>(k, "k"), vv = array_view<T>(v, "v");
  if (finite) {
    check_finite(qv, "q");
    check_finite(kv, "k");
    check_finite(vv, "v");
  }
  py::array out = new_array<T>(call.out_shape);
  py::array lse = new_array<T>(call.lse_shape);
  const qkv::TensorView<T> ov = mutable_view<T>(out, "out").as_rank4();
  const qkv::TensorView<T> lv = lse_view(mutable_view<T>(lse, "lse"));
  {
    py::gil_scoped_release release;
    if constexpr (std::is_same_v<T, double>) {
      qkv::reference_attention_forward(ov, lv, {}, qv.as_rank4(), kv.as_rank4(), vv.as_rank4(), call.options);
    } else {
      qkv::attention_forward(ov, lv, qv.as_rank4(), kv.as_rank4(), vv.as_rank4(), call.options);
    }
  }
  if (return_lse) return py::make_tuple(out, lse);
  return out;
}

py::object sdpa(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj, const py::dict& mask,
                const py::object& scale, bool return_lse, const std::string& kernel, int num_threads, bool finite) {
  const auto [q, k, v] = qkv_arrays(q_obj, k_obj, v_obj);
  CallOptions options;
  options.mask = mask;
  options.scale = scale;
  options.kernel = kernel;
  options.num_threads = num_threads;
  const AttentionCall call = prepare_call(q, k, v, options);
  switch (call.dtype) {
    case DType::f64:
      return forward_as<double>(q, k, v, call, return_lse, finite);
    case DType::f32:
      return forward_as<float>(q, k, v, call, return_lse, finite);
    case DType::bf16: {
      // bf16 widens exactly to float32; the result is float32.
      return forward_as<float>(tensor_to_numpy(widen_bf16(q, "q")), tensor_to_numpy(widen_bf16(k, "k")),
                               tensor_to_numpy(widen_bf16(v, "v")), call, return_lse, finite);
    }
  }
  throw py::type_error("unreachable dtype");
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def("scaled_dot_product_attention", &sdpa, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"),
        py::arg("scale"), py::arg("return_lse"), py::arg("kernel"), py::arg("num_threads"), py::arg("check_finite"),
        "Core of qkv.scaled_dot_product_attention (see that function's docstring); mask is a dict of mask "
        "keyword arguments.");
  m.def("default_num_threads", &qkv::default_num_threads,
        "Threads a call uses when num_threads=0: QKV_NUM_THREADS if set to a positive integer, else OpenMP's default.");
}

}  // namespace qkvpy
