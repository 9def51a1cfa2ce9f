// qkv._qkv.attention_backward: gradients of attention on numpy arrays (float32 through the fp32
// backward, float64 through the float64 reference). Public signature and docstring: qkv/attention.py.
#include <fmt/format.h>

#include "bind_util.h"
#include "bindings.h"
#include "qkv/backward.h"
#include "qkv/reference.h"

namespace qkvpy {
namespace {

// An array argument of element type T that must have exactly `shape` (out or lse given back by
// the caller).
template <class T>
qkv::TensorView<const T> given(const py::object& obj, const char* name, const std::vector<int64_t>& shape,
                               py::array& owner) {
  owner = aligned(obj);
  const qkv::TensorView<const T> v = array_view<T>(owner, name);
  qkv::require_shape(v.shape(), shape, name);
  return v;
}

template <class T>
py::tuple backward_as(const std::array<py::array, 3>& qkv_in, const py::array& dout_arr, const py::object& out_obj,
                      const py::object& lse_obj, const AttentionCall& call, bool return_dbias, bool finite) {
  const qkv::TensorView<const T> q = array_view<T>(qkv_in[0], "q"), k = array_view<T>(qkv_in[1], "k"),
                                 v = array_view<T>(qkv_in[2], "v"), dout = array_view<T>(dout_arr, "dout");
  if (finite) {
    check_finite(q, "q");
    check_finite(k, "k");
    check_finite(v, "v");
    check_finite(dout, "dout");
  }
  const qkv::TensorView<const T> q4 = q.as_rank4(), k4 = k.as_rank4(), v4 = v.as_rank4(), dout4 = dout.as_rank4();
  // Both backwards overwrite every element of their outputs, so the gradients go straight into
  // uninitialized numpy arrays: zero-filling S2's 9.4 MB first was a serial memset of 0.15 ms
  // (alone) to 0.5 ms (after a PyTorch call, per perf) in front of a 13 ms call.
  py::list grads;
  for (const py::array& like : qkv_in) grads.append(new_array<T>(shape_of(like)));
  if (return_dbias) {
    std::vector<int64_t> shape = call.lse_shape;
    shape.push_back(k4.dim(2));
    grads.append(new_array<T>(shape));
  }
  auto grad_view = [&grads](std::size_t i, const char* name) {
    py::array a = grads[i];
    return mutable_view<T>(a, name).as_rank4();
  };
  const qkv::TensorView<T> dq = grad_view(0, "dq"), dk = grad_view(1, "dk"), dv = grad_view(2, "dv"),
                           dbias = return_dbias ? grad_view(3, "dbias") : qkv::TensorView<T>();
  if constexpr (std::is_same_v<T, double>) {
    if (!out_obj.is_none()) {  // checked as for float32, though the float64 reference recomputes them
      py::array out_owner, lse_owner;
      if (dtype_of(out_obj, "out") != DType::f64) throw py::type_error("out must be float64 like the forward's result");
      if (dtype_of(lse_obj, "lse") != DType::f64) throw py::type_error("lse must be float64 like the forward's result");
      given<double>(out_obj, "out", call.out_shape, out_owner);
      given<double>(lse_obj, "lse", call.lse_shape, lse_owner);
    }
    InterruptibleRelease release;  // Ctrl-C stops it
    qkv::reference_attention_backward(dq, dk, dv, dbias, dout4, q4, k4, v4, call.options);
  } else {
    py::array out_owner, lse_owner;
    qkv::Tensor<float> out_buf;
    qkv::Tensor<double> lse_buf;
    qkv::TensorView<const float> out4;
    qkv::TensorView<const double> lse3;
    const bool have_forward = !out_obj.is_none() && !lse_obj.is_none();
    if (have_forward) {
      if (dtype_of(out_obj, "out") != DType::f32) throw py::type_error("out must be float32 like the forward's result");
      out4 = given<float>(out_obj, "out", call.out_shape, out_owner).as_rank4();
      const qkv::TensorView<const double> lse = lse_arg(lse_obj, lse_owner, lse_buf);
      qkv::require_shape(lse.shape(), call.lse_shape, "lse");
      lse3 = lse_view(lse);
    } else {
      out_buf = qkv::Tensor<float>(std::vector<int64_t>{q4.dim(0), q4.dim(1), q4.dim(2), v4.dim(3)}, "out");
      lse_buf = qkv::Tensor<double>(std::vector<int64_t>{q4.dim(0), q4.dim(1), q4.dim(2)}, "lse");
    }
    InterruptibleRelease release;  // Ctrl-C stops it
    if (!have_forward) {
      qkv::attention_forward_lse64(out_buf.view(), lse_buf.view(), q4, k4, v4, call.options);
      out4 = out_buf.cview();
      lse3 = lse_buf.cview();
    }
    qkv::attention_backward(dq, dk, dv, dbias, dout4, q4, k4, v4, out4, lse3, call.options);
  }
  return py::tuple(grads);
}

py::tuple backward(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj,
                   const py::object& dout_obj, const py::object& out_obj, const py::object& lse_obj,
                   const py::dict& mask, const py::object& scale, const py::object& return_dbias_obj,
                   const py::object& kernel, const py::object& num_threads, const py::object& simd,
                   const py::object& check_finite) {
  const std::array<py::array, 3> arrays = qkv_arrays(q_obj, k_obj, v_obj);
  const CallOptions options{.mask = mask,
                            .scale = scale,
                            .kernel = string_arg(kernel, "kernel"),
                            .num_threads = threads_arg(num_threads),
                            .simd = string_arg(simd, "simd")};
  const bool return_dbias = flag_arg(return_dbias_obj, "return_dbias"), finite = flag_arg(check_finite, "check_finite");
  const AttentionCall call = prepare_call(arrays[0], arrays[1], arrays[2], options);
  if (call.dtype == DType::bf16)
    throw py::type_error("attention_backward: uint16 (bfloat16) inputs are not supported; pass float32");
  if (dtype_of(dout_obj, "dout") != call.dtype)
    throw py::type_error(fmt::format("dout must have the dtype of q ({})", dtype_name(call.dtype)));
  const py::array dout = aligned(dout_obj);
  const std::vector<int64_t> dout_shape = shape_of(dout);
  if (dout_shape != call.out_shape)
    throw py::value_error(fmt::format("dout: shape {} must be the output's shape {}", qkv::shape_string(dout_shape),
                                      qkv::shape_string(call.out_shape)));
  if (out_obj.is_none() != lse_obj.is_none())
    throw py::value_error("pass both out and lse from the forward, or neither");
  if (call.dtype == DType::f64) return backward_as<double>(arrays, dout, out_obj, lse_obj, call, return_dbias, finite);
  return backward_as<float>(arrays, dout, out_obj, lse_obj, call, return_dbias, finite);
}

}  // namespace

void bind_backward(py::module_& m) {
  m.def("attention_backward", &backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dout"), py::arg("out"),
        py::arg("lse"), py::arg("mask"), py::arg("scale"), py::arg("return_dbias"), py::arg("kernel"),
        py::arg("num_threads"), py::arg("simd"), py::arg("check_finite"),
        "Core of qkv.attention_backward (see that function's docstring).");
}

}  // namespace qkvpy
