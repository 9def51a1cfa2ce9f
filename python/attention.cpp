// qkv._qkv.scaled_dot_product_attention: numpy in, numpy out. The public signature and docstring
// live in qkv/attention.py; this file converts arrays (zero-copy for float32 and float64, any
// strides), runs the kernel with the GIL released, and returns out (and lse).
#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bind_util.h"
#include "bindings.h"
#include "qkv/attention.h"
#include "qkv/reference.h"

namespace qkvpy {
namespace {

// uint16 arrays hold bfloat16 bits; qkv::bf16 is that same 16-bit pattern.
qkv::TensorView<const qkv::bf16> as_bf16(const qkv::TensorView<const uint16_t>& v) {
  return qkv::TensorView<const qkv::bf16>(reinterpret_cast<const qkv::bf16*>(v.data()), v.shape(), v.strides());
}

// T: the numpy element type of q, k, v (float, double or uint16_t holding bf16); R: of the results.
template <class T, class R>
py::object forward_as(const py::array& q, const py::array& k, const py::array& v, const AttentionCall& call,
                      bool return_lse, bool lse64, bool finite) {
  const qkv::TensorView<const T> qv = array_view<T>(q, "q"), kv = array_view<T>(k, "k"), vv = array_view<T>(v, "v");
  if constexpr (!std::is_same_v<T, uint16_t>) {
    if (finite) {
      check_finite(qv, "q");
      check_finite(kv, "k");
      check_finite(vv, "v");
    }
  } else if (finite) {
    for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
      const qkv::Tensor<float> wide = widen_bf16(*t, name);
      check_finite(wide.cview(), name);
    }
  }
  py::array out = new_array<R>(call.out_shape);
  // lse in float64 on every path (the fused kernels' m + log(l) before its rounding to fp32, which
  // attention_backward needs to recompute P to fp32 accuracy at large scores), rounded on return
  // unless lse64.
  py::array lse = new_array<double>(call.lse_shape);
  const qkv::TensorView<R> ov = mutable_view<R>(out, "out").as_rank4();
  const qkv::TensorView<double> lv = lse_view(mutable_view<double>(lse, "lse"));
  {
    InterruptibleRelease release;  // Ctrl-C stops it
    if constexpr (std::is_same_v<T, double>) {
      qkv::reference_attention_forward(ov, lv, {}, qv.as_rank4(), kv.as_rank4(), vv.as_rank4(), call.options);
    } else if constexpr (std::is_same_v<T, uint16_t>) {
      qkv::attention_forward_lse64(ov, lv, as_bf16(qv.as_rank4()), as_bf16(kv.as_rank4()), as_bf16(vv.as_rank4()),
                                   call.options);
    } else {
      qkv::attention_forward_lse64(ov, lv, qv.as_rank4(), kv.as_rank4(), vv.as_rank4(), call.options);
    }
  }
  if (!return_lse) return out;
  if (lse64 || std::is_same_v<R, double>) return py::make_tuple(out, lse);
  // The same number the fp32 kernel rounds to, refused where it would be inf from a finite value.
  py::array lse32 = new_array<float>(call.lse_shape);
  const double* from = static_cast<const double*>(lse.data());
  float* to = static_cast<float*>(lse32.mutable_data());
  for (py::ssize_t i = 0; i < lse.size(); ++i) to[i] = qkv::lse_to_float32(from[i]);
  return py::make_tuple(out, lse32);
}

py::object sdpa(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj, const py::dict& mask,
                const py::object& scale, bool return_lse, bool lse64, const py::object& kernel,
                const py::object& num_threads, const py::object& simd, const py::object& check_finite) {
  const auto [q, k, v] = qkv_arrays(q_obj, k_obj, v_obj);
  const CallOptions options{.mask = mask,
                            .scale = scale,
                            .kernel = string_arg(kernel, "kernel"),
                            .num_threads = threads_arg(num_threads),
                            .simd = string_arg(simd, "simd")};
  const bool finite = flag_arg(check_finite, "check_finite");
  const AttentionCall call = prepare_call(q, k, v, options);
  switch (call.dtype) {
    case DType::f64:
      return forward_as<double, double>(q, k, v, call, return_lse, lse64, finite);
    case DType::f32:
      return forward_as<float, float>(q, k, v, call, return_lse, lse64, finite);
    case DType::bf16:
      return forward_as<uint16_t, float>(q, k, v, call, return_lse, lse64, finite);
  }
  throw py::type_error("unreachable dtype");
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def("scaled_dot_product_attention", &sdpa, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"),
        py::arg("scale"), py::arg("return_lse"), py::arg("lse64"), py::arg("kernel"), py::arg("num_threads"),
        py::arg("simd"), py::arg("check_finite"),
        "Core of qkv.scaled_dot_product_attention (see that function's docstring); mask is a dict of mask "
        "keyword arguments.");
  m.def(
      "dropout_mask",
      [](const py::object& shape_obj, const py::dict& options) {
        const std::vector<int64_t> shape = index_list_arg(shape_obj, "shape");
        if (shape.size() < 2 || shape.size() > 4)
          throw py::value_error(fmt::format("shape must have 2 to 4 dims ([..., N, M]), got {}", shape.size()));
        for (const int64_t d : shape)
          if (d < 0) throw py::value_error(fmt::format("shape must not have negative dims, got {}", d));
        const qkv::Dropout d = dropout_arg(options);
        const std::size_t r = shape.size();
        const int64_t B = r == 4 ? shape[0] : 1, H = r >= 3 ? shape[r - 3] : 1, N = shape[r - 2], M = shape[r - 1];
        qkv::checked_numel(shape, sizeof(bool), "dropout_mask");  // numpy's "array is too big" names no argument
        py::array_t<bool> out = new_array<bool>(shape);
        bool* keep = out.mutable_data();
        {
          InterruptibleRelease release;  // Ctrl-C stops it
          qkv::InterruptScope* const interrupt = qkv::InterruptScope::current();
          for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t i = 0; i < N; ++i) {
                if (qkv::stop_requested(interrupt)) throw qkv::Interrupted();  // a row between checks
                const qkv::DropoutRow row(d, H, b, h, i);
                bool* dst = keep + ((b * H + h) * N + i) * M;
                for (int64_t j = 0; j < M; ++j) dst[j] = !d.active() || row.keep(j);
              }
        }
        return out;
      },
      py::arg("shape"), py::arg("options"),
      "Core of qkv.dropout_mask: the keep-mask [..., N, M] of dropout options {dropout_p, dropout_seed, "
      "dropout_offset}.");
  m.def("default_num_threads", &qkv::default_num_threads,
        "Threads a call uses when num_threads=0: QKV_NUM_THREADS if set to a positive integer, else OpenMP's default.");
  m.def(
      "simd_path", [](const std::string& simd) { return std::string(qkv::simd_path_name(qkv::parse_simd(simd))); },
      py::arg("simd") = "auto",
      "The SIMD path ('avx512', 'avx2', 'neon' or 'scalar') the fused kernel runs for `simd` on this CPU, honouring "
      "the QKV_SIMD environment variable. ValueError if that path is not available here.");
}

}  // namespace qkvpy
