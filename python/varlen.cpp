// qkv.varlen_attention / varlen_attention_backward: packed variable-length attention on numpy
// arrays (float32), as qkv/varlen.h computes it.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bind_util.h"
#include "bindings.h"
#include "qkv/varlen.h"

namespace qkvpy {
namespace {

std::vector<int64_t> offsets_arg(const py::handle& obj, const char* name) {
  if (!is_list_arg(obj)) throw py::type_error(fmt::format("{} must be a sequence of integers", name));
  std::vector<int64_t> out;
  for (const py::handle x : obj) out.push_back(index_arg(x, fmt::format("{}[{}]", name, out.size())));
  return out;
}

struct VarlenCall {
  std::vector<int64_t> cu_q, cu_k;
  MaskArgs mask;
  qkv::AttentionOptions options;
};

VarlenCall varlen_call(const py::handle& q, const py::handle& cu_q, const py::handle& cu_k, const py::dict& mask,
                       const py::object& scale, const py::object& num_threads) {
  VarlenCall c;
  c.cu_q = offsets_arg(cu_q, "cu_seqlens_q");
  c.cu_k = offsets_arg(cu_k, "cu_seqlens_k");
  const py::array a = py::reinterpret_borrow<py::array>(q);
  const int64_t H = a.ndim() == 3 ? a.shape(1) : 1;
  // Per sequence, as a batch of one: alibi_slopes are counted against H; masks given per batch row
  // or element are refused by varlen itself.
  c.mask = parse_mask(mask, 1, H, 1, 1);
  c.options.mask = c.mask.mask;
  c.options.dropout = dropout_arg(mask);
  c.options.scale = scale_arg(scale);
  c.options.num_threads = threads_arg(num_threads);
  return c;
}

py::tuple forward(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj, const py::object& cu_q,
                  const py::object& cu_k, const py::dict& mask, const py::object& scale,
                  const py::object& num_threads) {
  py::array qo, ko, vo;
  const auto q = float32_view(q_obj, "q", qo), k = float32_view(k_obj, "k", ko), v = float32_view(v_obj, "v", vo);
  const VarlenCall c = varlen_call(qo, cu_q, cu_k, mask, scale, num_threads);
  if (q.rank() != 3 || v.rank() != 3)
    throw py::value_error(fmt::format("q, k, v must be packed [total, heads, dim], got shapes {} and {}",
                                      qkv::shape_string(q.shape()), qkv::shape_string(v.shape())));
  qkv::Tensor<float> out({q.dim(0), q.dim(1), v.dim(2)});
  qkv::Tensor<double> lse({q.dim(1), q.dim(0)});
  {
    InterruptibleRelease release;  // Ctrl-C stops it
    qkv::varlen_attention_forward(out.view(), lse.view(), q, k, v, c.cu_q, c.cu_k, c.options);
  }
  return py::make_tuple(tensor_to_numpy(std::move(out)), tensor_to_numpy(std::move(lse)));
}

py::tuple backward(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj,
                   const py::object& dout_obj, const py::object& out_obj, const py::object& lse_obj,
                   const py::object& cu_q, const py::object& cu_k, const py::dict& mask, const py::object& scale,
                   const py::object& num_threads) {
  py::array qo, ko, vo, doo, oo;
  const auto q = float32_view(q_obj, "q", qo), k = float32_view(k_obj, "k", ko), v = float32_view(v_obj, "v", vo);
  const auto dout = float32_view(dout_obj, "dout", doo), out = float32_view(out_obj, "out", oo);
  py::array lse_owner;
  qkv::Tensor<double> lse_buf;
  const qkv::TensorView<const double> lse = lse_arg(lse_obj, lse_owner, lse_buf);
  const VarlenCall c = varlen_call(qo, cu_q, cu_k, mask, scale, num_threads);
  if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3)
    throw py::value_error("q, k, v must be packed [total, heads, dim]");
  qkv::Tensor<float> dq({q.dim(0), q.dim(1), q.dim(2)}), dk({k.dim(0), k.dim(1), k.dim(2)}),
      dv({v.dim(0), v.dim(1), v.dim(2)});
  {
    InterruptibleRelease release;  // Ctrl-C stops it
    qkv::varlen_attention_backward(dq.view(), dk.view(), dv.view(), dout, q, k, v, out, lse, c.cu_q, c.cu_k, c.options);
  }
  return py::make_tuple(tensor_to_numpy(std::move(dq)), tensor_to_numpy(std::move(dk)), tensor_to_numpy(std::move(dv)));
}

}  // namespace

void bind_varlen(py::module_& m) {
  m.def("varlen_forward", &forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens_q"),
        py::arg("cu_seqlens_k"), py::arg("mask"), py::arg("scale"), py::arg("num_threads"),
        "Core of qkv.varlen_attention: (out [total_q, H, Dv] float32, lse [H, total_q] float64).");
  m.def("varlen_backward", &backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dout"), py::arg("out"),
        py::arg("lse"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("mask"), py::arg("scale"),
        py::arg("num_threads"), "Core of qkv.varlen_attention_backward: (dq, dk, dv).");
}

}  // namespace qkvpy
