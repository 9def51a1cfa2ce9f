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

// Everything one forward call needs, with the caller's shapes.
struct ForwardCall {
  DType dtype = DType::f32;
  std::vector<int64_t> out_shape, lse_shape;  // q.shape[:-1] + (Dv,), q.shape[:-1]
  MaskArgs mask;
  qkv::AttentionOptions options;
};

ForwardCall prepare(const py::array& q, const py::array& k, const py::array& v, const py::dict& mask,
                    const py::object& scale, const std::string& kernel, int num_threads) {
  ForwardCall call;
  call.dtype = dtype_of(q, "q");
  const DType tk = dtype_of(k, "k"), tv = dtype_of(v, "v");
  if (tk != call.dtype || tv != call.dtype)
    throw py::type_error(fmt::format("q, k and v must share a dtype, got {}, {} and {}", dtype_name(call.dtype),
                                     dtype_name(tk), dtype_name(tv)));
  check_qkv_shapes(q, k, v);
  const Lead lead = lead_of(q, "q");
  const py::ssize_t r = q.ndim();
  call.lse_shape = shape_of(q);
  call.lse_shape.pop_back();
  call.out_shape = call.lse_shape;
  call.out_shape.push_back(v.shape(r - 1));
  call.mask = parse_mask(mask, lead.B, lead.H, q.shape(r - 2), k.shape(r - 2));
  call.options.mask = call.mask.mask;
  if (!scale.is_none()) {
    if (py::isinstance<py::bool_>(scale) || PyNumber_Check(scale.ptr()) == 0)
      throw py::type_error("scale must be a number or None");
    call.options.scale = py::float_(scale).cast<double>();
  }
  call.options.kernel = parse_kernel(kernel);
  if (num_threads < 0) throw py::value_error(fmt::format("num_threads must be >= 0 (0 = default), got {}", num_threads));
  call.options.num_threads = num_threads;
  return call;
}

template <class T>
py::object forward_as(const py::array& q, const py::array& k, const py::array& v, ForwardCall& call, bool return_lse,
                      bool finite) {
  const qkv::TensorView<const T> qv = array_view<T>(q, "q"), kv = array_view<T>(k, "k"), vv = array_view<T>(v, "v");
  if (finite) {
    check_finite(qv, "q");
    check_finite(kv, "k");
    check_finite(vv, "v");
  }
  py::array out = new_array<T>(call.out_shape);
  py::array lse = new_array<T>(call.lse_shape);
  qkv::TensorView<T> ov = mutable_view<T>(out, "out").as_rank4();
  qkv::TensorView<T> lv = mutable_view<T>(lse, "lse").as_rank4();
  // as_rank4 gives [1, 1, 1, N] for lse of a rank-2 call; the kernels want [B, H, N].
  const qkv::TensorView<T> l3(lv.data(), std::array<int64_t, 3>{lv.dim(1), lv.dim(2), lv.dim(3)},
                              std::array<int64_t, 3>{lv.stride(1), lv.stride(2), lv.stride(3)});
  {
    py::gil_scoped_release release;
    if constexpr (std::is_same_v<T, double>) {
      qkv::reference_attention_forward(ov, l3, {}, qv.as_rank4(), kv.as_rank4(), vv.as_rank4(), call.options);
    } else {
      qkv::attention_forward(ov, l3, qv.as_rank4(), kv.as_rank4(), vv.as_rank4(), call.options);
    }
  }
  if (return_lse) return py::make_tuple(out, lse);
  return out;
}

py::object sdpa(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj, const py::dict& mask,
                const py::object& scale, bool return_lse, const std::string& kernel, int num_threads, bool finite) {
  dtype_of(q_obj, "q");
  dtype_of(k_obj, "k");
  dtype_of(v_obj, "v");
  const py::array q = aligned(q_obj), k = aligned(k_obj), v = aligned(v_obj);
  ForwardCall call = prepare(q, k, v, mask, scale, kernel, num_threads);
  switch (call.dtype) {
    case DType::f64:
      return forward_as<double>(q, k, v, call, return_lse, finite);
    case DType::f32:
      return forward_as<float>(q, k, v, call, return_lse, finite);
    case DType::bf16: {
      // bf16 widens exactly to float32; the result is float32.
      const qkv::Tensor<float> qf = widen_bf16(q, "q"), kf = widen_bf16(k, "k"), vf = widen_bf16(v, "v");
      auto as_array = [](const qkv::Tensor<float>& t) {
        std::vector<py::ssize_t> dims(t.shape().begin(), t.shape().end());
        return py::array_t<float>(dims, t.data());
      };
      return forward_as<float>(as_array(qf), as_array(kf), as_array(vf), call, return_lse, finite);
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
