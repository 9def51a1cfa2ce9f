#include "bind_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "qkv/address_space.h"
#include "qkv/attention_options.h"
#include "qkv/mask.h"
#include "qkv/options_parse.h"
#include "qkv/out_of_memory.h"
#include "qkv/suggest.h"

namespace qkvpy {

DType dtype_of(const py::handle& obj, const char* name) {
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(
        fmt::format("{} must be a numpy array, got {}", name, std::string(py::str(obj.get_type().attr("__name__")))));
  if (py::isinstance<py::array_t<float>>(obj)) return DType::f32;
  if (py::isinstance<py::array_t<double>>(obj)) return DType::f64;
  if (py::isinstance<py::array_t<uint16_t>>(obj)) return DType::bf16;
  const std::string got = py::str(py::reinterpret_borrow<py::array>(obj).dtype());
  throw py::type_error(
      fmt::format("{}: dtype {} is not supported; use float32, float64, or uint16 holding bfloat16 bits", name, got));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::bf16:
      return "uint16 (bfloat16)";
  }
  return "?";
}

std::vector<int64_t> shape_of(const py::array& a) {
  std::vector<int64_t> shape(static_cast<std::size_t>(a.ndim()));
  for (py::ssize_t i = 0; i < a.ndim(); ++i) shape[static_cast<std::size_t>(i)] = a.shape(i);
  return shape;
}

py::array aligned(const py::handle& obj) {
  auto a = py::reinterpret_borrow<py::array>(obj);
  if ((a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_) != 0) return a;
  return py::module_::import("numpy").attr("ascontiguousarray")(a);
}

namespace {

template <class T>
std::array<int64_t, 4> element_strides(const py::array& a, const char* name) {
  if (a.ndim() > 4)
    throw py::value_error(
        fmt::format("{}: rank {} is above 4 (shape {})", name, a.ndim(), qkv::shape_string(shape_of(a))));
  std::array<int64_t, 4> strides{};
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    const py::ssize_t bytes = a.strides(i);
    if (bytes % static_cast<py::ssize_t>(sizeof(T)) != 0)
      throw py::value_error(
          fmt::format("{}: stride of {} bytes in dim {} is not a multiple of the element size {}; "
                      "pass np.ascontiguousarray({})",
                      name, bytes, i, sizeof(T), name));
    strides[static_cast<std::size_t>(i)] = bytes / static_cast<py::ssize_t>(sizeof(T));
  }
  return strides;
}

}  // namespace

template <class T>
qkv::TensorView<const T> array_view(const py::array& a, const char* name) {
  const std::array<int64_t, 4> strides = element_strides<T>(a, name);
  const std::vector<int64_t> shape = shape_of(a);
  return qkv::TensorView<const T>(static_cast<const T*>(a.data()), shape,
                                  std::span<const int64_t>(strides.data(), shape.size()));
}

template <class T>
qkv::TensorView<T> mutable_view(py::array& a, const char* name) {
  const std::array<int64_t, 4> strides = element_strides<T>(a, name);
  const std::vector<int64_t> shape = shape_of(a);
  return qkv::TensorView<T>(static_cast<T*>(a.mutable_data()), shape,
                            std::span<const int64_t>(strides.data(), shape.size()));
}

namespace {

// Results of `shape` with `element_bytes` per element must fit in the machine's memory: a larger
// request (decode_attention_weights(top_k=2**31) over 5 keys: 24 GB) could be granted by
// overcommit, and the process SIGKILLed as it is written, instead of raising MemoryError. A
// request past 2^64 bytes has no uint64 count for OutOfMemory (top_k=2**62 was reported as
// 18446744073709551615 bytes, the saturated count): it is given as a float and said to be so.
void require_in_memory(const std::vector<int64_t>& shape, std::size_t element_bytes) {
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d <= 0; })) return;  // no elements
  unsigned __int128 bytes = element_bytes;
  double approx = static_cast<double>(element_bytes);
  bool beyond = false;
  for (const int64_t d : shape) {
    approx *= static_cast<double>(d);
    beyond = beyond || (bytes *= static_cast<uint64_t>(d)) > UINT64_MAX;  // each d < 2^63: no wrap
  }
  const std::string what = fmt::format("results of shape {}", qkv::shape_string(shape));
  if (beyond) {
    PyErr_SetString(
        PyExc_MemoryError,
        fmt::format("{}: cannot allocate {:.4g} bytes (more than a 64-bit address space holds)", what, approx).c_str());
    throw py::error_already_set();
  }
  const unsigned long long physical = qkv::physical_memory_bytes();
  if (physical != 0 && bytes > physical) throw qkv::OutOfMemory(what, static_cast<uint64_t>(bytes));
}

}  // namespace

template <class T>
py::array_t<T> new_array(const std::vector<int64_t>& shape) {
  require_in_memory(shape, sizeof(T));
  return py::array_t<T>(std::vector<py::ssize_t>(shape.begin(), shape.end()));
}

std::pair<py::array, py::array> new_top_k(const std::vector<int64_t>& shape) {
  require_in_memory(shape, sizeof(float) + sizeof(int64_t));  // both arrays at once
  return {new_array<float>(shape), new_array<int64_t>(shape)};
}

namespace {

// "(i, j, ...)": an element's index as numpy writes it ("(3,)" for a vector).
std::string index_text(std::span<const int64_t> index) {
  std::string where;
  for (const int64_t i : index) where += (where.empty() ? "" : ", ") + std::to_string(i);
  return "(" + where + (index.size() == 1 ? ",)" : ")");
}

}  // namespace

template <class T>
void check_finite(qkv::TensorView<const T> v, const char* name, bool allow_neg_inf) {
  const std::optional<qkv::NonFinite> bad = qkv::find_non_finite(v, allow_neg_inf);
  if (!bad) return;
  const double x = bad->value;
  throw py::value_error(fmt::format("{} contains {} at index {}", name,
                                    std::isnan(x) ? "NaN" : (x > 0 ? "+inf" : "-inf"), index_text(bad->index)));
}

template qkv::TensorView<const float> array_view(const py::array&, const char*);
template qkv::TensorView<const double> array_view(const py::array&, const char*);
template qkv::TensorView<const uint16_t> array_view(const py::array&, const char*);
template qkv::TensorView<const uint8_t> array_view(const py::array&, const char*);
template qkv::TensorView<float> mutable_view(py::array&, const char*);
template qkv::TensorView<double> mutable_view(py::array&, const char*);
template qkv::TensorView<int64_t> mutable_view(py::array&, const char*);
template py::array_t<float> new_array(const std::vector<int64_t>&);
template py::array_t<double> new_array(const std::vector<int64_t>&);
template py::array_t<int64_t> new_array(const std::vector<int64_t>&);
template py::array_t<bool> new_array(const std::vector<int64_t>&);
template void check_finite(qkv::TensorView<const float>, const char*, bool);
template void check_finite(qkv::TensorView<const double>, const char*, bool);

Lead lead_of(const py::array& a, const char* name) {
  if (a.ndim() < 2 || a.ndim() > 4)
    throw py::value_error(fmt::format("{}: expected rank 2 [N, D], 3 [H, N, D] or 4 [B, H, N, D], got shape {}", name,
                                      qkv::shape_string(shape_of(a))));
  Lead lead;
  if (a.ndim() >= 3) lead.H = a.shape(a.ndim() - 3);
  if (a.ndim() == 4) lead.B = a.shape(0);
  return lead;
}

void check_qkv_shapes(const py::array& q, const py::array& k, const py::array& v) {
  const Lead lq = lead_of(q, "q"), lk = lead_of(k, "k");
  lead_of(v, "v");
  const std::string sq = qkv::shape_string(shape_of(q)), sk = qkv::shape_string(shape_of(k)),
                    sv = qkv::shape_string(shape_of(v));
  if (q.ndim() != k.ndim() || q.ndim() != v.ndim())
    throw py::value_error(fmt::format("q {}, k {} and v {} must have the same rank", sq, sk, sv));
  const py::ssize_t r = q.ndim();
  if (q.shape(r - 1) != k.shape(r - 1))
    throw py::value_error(fmt::format("q {} and k {} must have the same last dim (head dim D)", sq, sk));
  for (py::ssize_t i = 0; i < r - 1; ++i)
    if (k.shape(i) != v.shape(i))
      throw py::value_error(fmt::format("k {} and v {} must agree on every dim but the last", sk, sv));
  if (lq.B != lk.B) throw py::value_error(fmt::format("q {} and k {} have different batch sizes", sq, sk));
  qkv::require_head_groups(lq.H, lk.H, fmt::format("q {} and k {}", sq, sk));
  if (q.shape(r - 1) == 0) throw py::value_error(fmt::format("q {}: head dim D must be at least 1", sq));
  if (v.shape(r - 1) == 0) throw py::value_error(fmt::format("v {}: value head dim Dv must be at least 1", sv));
}

bool is_bool(const py::handle& obj) {
  static const py::handle numpy_bool = py::object(py::module_::import("numpy").attr("bool_")).release();  // kept
  return py::isinstance<py::bool_>(obj) || py::isinstance(obj, numpy_bool);
}

namespace {

// An array or tensor of rank >= 1 (numpy's, torch's, anything with an int `ndim`): not a scalar,
// though numpy converts one of size 1 to a number and index, and torch does too.
bool has_dims(const py::handle& obj) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj).ndim() > 0;
  if (!py::hasattr(obj, "ndim")) return false;
  const py::object ndim = obj.attr("ndim");
  return PyLong_Check(ndim.ptr()) != 0 && ndim.cast<py::ssize_t>() > 0;
}

// A real number: not a bool, str or complex (all three pass PyNumber_Check or convert to float).
bool is_real(const py::handle& obj) {
  return !is_bool(obj) && PyNumber_Check(obj.ptr()) != 0 && !py::isinstance<py::str>(obj) &&
         PyComplex_Check(obj.ptr()) == 0 && !has_dims(obj);
}

// repr(obj) while a Python error is set (repr runs Python code, which needs none set).
std::string shown_while_failing(const py::handle& obj) {
  const py::error_scope pending;
  return py::repr(obj);
}

// After a conversion of an argument failed with a Python error set: raises `type` with `message`,
// which names the argument (the object's own message would not), the object's error as its cause.
// An interrupt, an exit or running out of memory is not a bad argument: it propagates as raised.
[[noreturn]] void refuse_conversion(PyObject* type, const std::string& message) {
  if (PyErr_ExceptionMatches(PyExc_Exception) == 0 || PyErr_ExceptionMatches(PyExc_MemoryError) != 0)
    throw py::error_already_set();
  py::raise_from(type, message.c_str());
  throw py::error_already_set();
}

int64_t to_index(const py::handle& obj_in, const std::string& name) {
  // A 0-d array is its element (numpy's own message for a 0-d float array names no argument).
  const py::object obj =
      py::isinstance<py::array>(obj_in) && py::array(py::reinterpret_borrow<py::object>(obj_in)).ndim() == 0
          ? obj_in.attr("item")()
          : py::reinterpret_borrow<py::object>(obj_in);
  const auto refuse = [&] {
    return py::type_error(fmt::format("{} must be an integer, got {}", name, std::string(py::repr(obj))));
  };
  if (is_bool(obj) || PyIndex_Check(obj.ptr()) == 0 || has_dims(obj)) throw refuse();
  PyObject* i = PyNumber_Index(obj.ptr());
  if (i == nullptr)
    refuse_conversion(PyExc_TypeError, fmt::format("{} must be an integer, got {}", name, shown_while_failing(obj)));
  const py::object index = py::reinterpret_steal<py::object>(i);
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) throw py::value_error(fmt::format("{} = {} is out of range", name, std::string(py::str(index))));
  return static_cast<int64_t>(value);
}

double to_float(const py::handle& obj, const std::string& name) {
  if (!is_real(obj)) throw py::type_error(fmt::format("{} must be a number, got {}", name, std::string(py::repr(obj))));
  PyObject* f = PyNumber_Float(obj.ptr());
  if (f == nullptr) {
    const std::string shown = shown_while_failing(obj);
    if (PyErr_ExceptionMatches(PyExc_OverflowError) != 0)  // 10**400
      refuse_conversion(PyExc_ValueError, fmt::format("{} = {} is out of range", name, shown));
    refuse_conversion(PyExc_TypeError, fmt::format("{} must be a number, got {}", name, shown));
  }
  return py::reinterpret_steal<py::object>(f).cast<double>();
}

}  // namespace

template <class T>
py::array_t<T> tensor_to_numpy(qkv::Tensor<T>&& t) {
  auto* owned = new qkv::Tensor<T>(std::move(t));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<qkv::Tensor<T>*>(p); });
  std::vector<py::ssize_t> dims(owned->shape().begin(), owned->shape().end());
  return py::array_t<T>(dims, owned->data(), free_when_done);
}
template py::array_t<float> tensor_to_numpy(qkv::Tensor<float>&&);
template py::array_t<double> tensor_to_numpy(qkv::Tensor<double>&&);

std::array<py::array, 3> qkv_arrays(const py::object& q, const py::object& k, const py::object& v) {
  const DType tq = dtype_of(q, "q"), tk = dtype_of(k, "k"), tv = dtype_of(v, "v");
  if (tk != tq || tv != tq)
    throw py::type_error(fmt::format("q, k and v must share a dtype, got {}, {} and {}", dtype_name(tq), dtype_name(tk),
                                     dtype_name(tv)));
  return {aligned(q), aligned(k), aligned(v)};
}

uint64_t seed_arg(const py::handle& obj, const std::string& name) {
  const std::string shown = py::repr(obj).cast<std::string>();
  if (is_bool(obj)) throw py::type_error(fmt::format("{} must be an integer, got {}", name, shown));
  PyObject* index = PyNumber_Index(obj.ptr());
  if (index == nullptr) refuse_conversion(PyExc_TypeError, fmt::format("{} must be an integer, got {}", name, shown));
  const py::object i = py::reinterpret_steal<py::object>(index);
  const unsigned long long v = PyLong_AsUnsignedLongLong(i.ptr());
  if (PyErr_Occurred())
    refuse_conversion(PyExc_ValueError, fmt::format("{} must be in [0, 2**64), got {}", name, shown));
  return v;
}

AttentionCall prepare_call(const py::array& q, const py::array& k, const py::array& v, const CallOptions& options) {
  AttentionCall call;
  call.dtype = dtype_of(q, "q");
  check_qkv_shapes(q, k, v);
  const Lead lead = lead_of(q, "q");
  const py::ssize_t r = q.ndim();
  call.lse_shape = shape_of(q);
  call.lse_shape.pop_back();
  call.out_shape = call.lse_shape;
  call.out_shape.push_back(v.shape(r - 1));
  call.mask = parse_mask(options.mask, lead.B, lead.H, q.shape(r - 2), k.shape(r - 2));
  call.options.mask = call.mask.mask;
  call.options.dropout = dropout_arg(options.mask);
  apply_options(options, call.options);
  return call;
}

template <class T>
qkv::TensorView<T> lse_view(qkv::TensorView<T> lse) {
  const qkv::TensorView<T> l4 = lse.as_rank4();
  return qkv::TensorView<T>(l4.data(), std::array<int64_t, 3>{l4.dim(1), l4.dim(2), l4.dim(3)},
                            std::array<int64_t, 3>{l4.stride(1), l4.stride(2), l4.stride(3)});
}
template qkv::TensorView<float> lse_view(qkv::TensorView<float>);
template qkv::TensorView<double> lse_view(qkv::TensorView<double>);
template qkv::TensorView<const float> lse_view(qkv::TensorView<const float>);
template qkv::TensorView<const double> lse_view(qkv::TensorView<const double>);

qkv::TensorView<const float> float32_view(const py::handle& obj, const char* name, py::array& owner) {
  // Not dtype_of's message: its uint16 (bfloat16 bits) is for attention only, and float16 would
  // then be pointed at it.
  if (py::isinstance<py::array>(obj) && !py::isinstance<py::array_t<float>>(obj) &&
      !py::isinstance<py::array_t<double>>(obj))
    throw py::type_error(fmt::format("{}: dtype {} is not supported; pass float32 (or float64, rounded to float32)",
                                     name, std::string(py::str(py::reinterpret_borrow<py::array>(obj).dtype()))));
  const DType t = dtype_of(obj, name);
  if (t == DType::f32) {
    owner = aligned(obj);
  } else {
    // Only the distinct elements are rounded: a broadcast dimension (stride 0, as np.broadcast_to
    // makes) is cut to one entry, and the float32 copy is broadcast back, so a float64 input
    // costs what its float32 form would.
    const py::array wide = aligned(obj);
    py::tuple cut(wide.ndim());
    bool broadcast = false;
    for (py::ssize_t d = 0; d < wide.ndim(); ++d) {
      const bool b = wide.strides(d) == 0 && wide.shape(d) > 1;
      broadcast |= b;
      cut[static_cast<std::size_t>(d)] = b ? py::slice(0, 1, 1) : py::slice(py::none(), py::none(), py::none());
    }
    const py::array distinct = broadcast ? py::array(wide[cut]) : wide;
    // numpy's cast would turn a finite 1e300 into inf: refused as loading such a .npy is.
    const qkv::TensorView<const double> w = array_view<double>(distinct, name);
    qkv::for_each_element(w, [&](const double& x, const std::array<int64_t, 4>& idx) {
      if (qkv::overflows_float32(x))
        throw py::value_error(fmt::format("{}: element {} at index {} overflows float32", name, x,
                                          index_text(std::span(idx).last(static_cast<std::size_t>(w.rank())))));
    });
    owner = py::array_t<float>::ensure(distinct);
    if (broadcast) owner = py::module_::import("numpy").attr("broadcast_to")(owner, wide.attr("shape"));
  }
  return array_view<float>(owner, name);
}

qkv::TensorView<const double> lse_arg(const py::handle& obj, py::array& owner, qkv::Tensor<double>& widened) {
  const DType t = dtype_of(obj, "lse");
  if (t == DType::bf16) throw py::type_error("lse must be float64 (or float32) like the forward's result");
  owner = aligned(obj);
  if (t == DType::f64) return array_view<double>(owner, "lse");
  widened = qkv::to_contiguous<double>(array_view<float>(owner, "lse"));
  return widened.cview();
}

CallOptions split_kwargs(const py::kwargs& kwargs, const char* function) {
  static const char* const kMaskKeys[] = {"causal",    "causal_align", "key_lengths",  "query_lengths", "window",
                                          "keep_mask", "bias",         "alibi_slopes", "softcap"};
  CallOptions call;
  for (const auto& [key_obj, value] : kwargs) {
    const std::string key = py::cast<std::string>(key_obj);
    bool is_mask = false;
    for (const char* m : kMaskKeys) is_mask |= key == m;
    if (is_mask) {
      call.mask[key_obj] = value;
    } else if (key == "scale") {
      call.scale = py::reinterpret_borrow<py::object>(value);
    } else if (key == "kernel") {
      call.kernel = string_arg(value, "kernel");
    } else if (key == "num_threads") {
      call.num_threads = threads_arg(value);
    } else if (key == "simd") {
      call.simd = string_arg(value, "simd");
    } else if (key == "check_finite") {
      call.check_finite = flag_arg(value, "check_finite");
    } else {
      throw py::type_error(fmt::format("{}() got an unexpected keyword argument '{}'", function, key));
    }
  }
  return call;
}

void apply_options(const CallOptions& call, qkv::AttentionOptions& options) {
  options.scale = scale_arg(call.scale);
  options.kernel = qkv::parse_kernel(call.kernel);
  options.num_threads = call.num_threads;
  options.simd = qkv::parse_simd(call.simd);
}

int64_t index_arg(const py::handle& obj, const std::string& name) { return to_index(obj, name); }

bool is_list_arg(const py::handle& obj) {
  if (py::isinstance<py::array>(obj)) return py::array(py::reinterpret_borrow<py::object>(obj)).ndim() > 0;
  return py::isinstance<py::sequence>(obj) && !py::isinstance<py::str>(obj) && !py::isinstance<py::bytes>(obj);
}

std::vector<int64_t> index_list_arg(const py::handle& obj, const std::string& name) {
  if (!is_list_arg(obj))
    throw py::type_error(fmt::format("{} must be a sequence of integers, got {}", name, std::string(py::repr(obj))));
  std::vector<int64_t> out;
  for (const py::handle item : obj) out.push_back(to_index(item, fmt::format("{}[{}]", name, out.size())));
  return out;
}

int threads_arg(const py::handle& obj) {
  const int64_t n = to_index(obj, "num_threads");
  if (n < 0) throw py::value_error(fmt::format("num_threads must be >= 0 (0 = default), got {}", n));
  if (n > std::numeric_limits<int>::max()) throw py::value_error(fmt::format("num_threads = {} is out of range", n));
  return static_cast<int>(n);
}

bool flag_arg(const py::handle& obj, const std::string& name) {
  if (!is_bool(obj))
    throw py::type_error(fmt::format("{} must be True or False, got {}", name, std::string(py::repr(obj))));
  return obj.cast<bool>();
}

std::string string_arg(const py::handle& obj, const std::string& name) {
  if (!py::isinstance<py::str>(obj))
    throw py::type_error(fmt::format("{} must be a string, got {}", name, std::string(py::repr(obj))));
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(obj.ptr(), &size);
  if (utf8 == nullptr) {  // a lone surrogate ('\udcff', from undecodable bytes) has no UTF-8 form
    PyErr_Clear();
    throw py::value_error(
        fmt::format("{} = {} is not valid Unicode text (a lone surrogate)", name, std::string(py::repr(obj))));
  }
  return std::string(utf8, static_cast<std::size_t>(size));
}

double number_arg(const py::handle& obj, const std::string& name) { return to_float(obj, name); }

std::string path_arg(const py::handle& obj, const std::string& name) {
  // The bytes os.fsencode gives, as open() takes them: a name that is not UTF-8 on disk comes
  // from os.listdir as a str with surrogate escapes, which a plain UTF-8 cast refuses.
  const auto bytes_of = [](const py::handle& path) -> std::optional<std::string> {
    if (py::isinstance<py::bytes>(path)) return path.cast<std::string>();
    if (!py::isinstance<py::str>(path)) return std::nullopt;
    PyObject* encoded = PyUnicode_EncodeFSDefault(path.ptr());
    if (encoded == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::bytes>(encoded).cast<std::string>();
  };
  if (auto path = bytes_of(obj)) return *path;
  if (py::hasattr(obj, "__fspath__"))
    if (auto path = bytes_of(obj.attr("__fspath__")())) return *path;
  throw py::type_error(
      fmt::format("{} must be a path (str, bytes or os.PathLike), got {}", name, std::string(py::repr(obj))));
}

void bind_argument_checks(py::module_& m) {
  m.def("_index_arg", [](const py::object& obj, const std::string& name) { return index_arg(obj, name); });
  m.def("_number_arg", [](const py::object& obj, const std::string& name) { return number_arg(obj, name); });
  m.def("_flag_arg", [](const py::object& obj, const std::string& name) { return flag_arg(obj, name); });
  m.def("_threads_arg", [](const py::object& obj) { return threads_arg(obj); });
  m.def("_scale_arg", [](const py::object& obj) { return scale_arg(obj); });
  m.def("_dropout_p_arg", [](const py::object& obj) { return qkv::dropout_p_value(to_float(obj, "dropout_p")); });
  m.def("_float32_array", [](const py::object& obj, const std::string& name) {
    py::array owner;
    float32_view(obj, name.c_str(), owner);
    return py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(owner);
  });
  m.def(
      "_closest_name",
      [](const std::string& given, const std::vector<std::string>& known) { return qkv::closest_name(given, known); },
      "The known name closest to a mistyped one, or None: the rule of the CLI's \"did you mean\" (qkv/suggest.h).");
}

std::optional<double> scale_arg(const py::handle& obj) {
  if (obj.is_none()) return std::nullopt;
  if (!is_real(obj))
    throw py::type_error(fmt::format("scale must be a number or None, got {}", std::string(py::repr(obj))));
  return to_float(obj, "scale");
}

qkv::Tensor<float> widen_bf16(const py::array& a, const char* name) {
  const qkv::TensorView<const uint16_t> bits = array_view<uint16_t>(a, name);
  // bf16 is a struct of its 16 bits, so the same memory read as bf16 widens exactly.
  static_assert(sizeof(qkv::bf16) == sizeof(uint16_t));
  return qkv::to_contiguous<float>(
      qkv::TensorView<const qkv::bf16>(reinterpret_cast<const qkv::bf16*>(bits.data()), bits.shape(), bits.strides()));
}

namespace {

// Runs on the calling thread with the GIL released; PyErr_CheckSignals needs it back. Not while
// the interpreter exits (gil_release.h): the call runs on to its end instead.
bool python_signal_pending(void*) {
  if (interpreter_exiting()) return false;
  py::gil_scoped_acquire gil;
  return PyErr_CheckSignals() != 0;
}

}  // namespace

InterruptibleRelease::PendingSignals::PendingSignals() {
  if (PyErr_CheckSignals() != 0) throw qkv::Interrupted();  // module.cpp raises the Python error it left
}

InterruptibleRelease::InterruptibleRelease() : scope_(&python_signal_pending, nullptr) {}

}  // namespace qkvpy
