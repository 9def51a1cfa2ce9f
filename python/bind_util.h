// Shared pieces of the Python bindings: numpy arrays as qkv views (zero-copy, any strides), dtype
// checks that raise TypeError, argument conversions, and the finite-value check (the mask
// dictionary is bind_mask.h's). Everything here runs with the GIL held.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "bind_mask.h"
#include "gil_release.h"
#include "qkv/attention.h"
#include "qkv/interrupt.h"
#include "qkv/tensor.h"

namespace qkvpy {

namespace py = pybind11;

enum class DType { f32, f64, bf16 };

// The element type of a numpy array argument: float32, float64, or uint16 read as bfloat16 bits.
// Raises TypeError naming `name` for anything else (ints, complex, float16, non-native byte order)
// or for an object that is not a numpy array.
DType dtype_of(const py::handle& obj, const char* name);
const char* dtype_name(DType t);

// A zero-copy view of a numpy array of T (rank <= 4; strides are converted from bytes to elements).
// The caller keeps the array alive. Raises ValueError for rank > 4 or strides that are not a whole
// number of elements.
template <class T>
qkv::TensorView<const T> array_view(const py::array& a, const char* name);
template <class T>
qkv::TensorView<T> mutable_view(py::array& a, const char* name);

// The array itself if its data is aligned for its dtype (numpy's usual case), else an aligned
// contiguous copy: kernels may use aligned vector loads on element boundaries.
py::array aligned(const py::handle& obj);

// A new C-contiguous array of T with the given shape. qkv::OutOfMemory (MemoryError) if it is
// larger than the machine's physical memory.
template <class T>
py::array_t<T> new_array(const std::vector<int64_t>& shape);

// The (float32 values, int64 indices) results of a top-k tool, checked against the machine's
// memory together.
std::pair<py::array, py::array> new_top_k(const std::vector<int64_t>& shape);

// Moves a tensor into a numpy array that owns it (no copy).
template <class T>
py::array_t<T> tensor_to_numpy(qkv::Tensor<T>&& t);

// A float32 view of a numpy float32 or float64 array argument (float64 is rounded into a copy held
// by `owner`); TypeError for other dtypes, ValueError for rank > 4 or a finite float64 element
// beyond float32's range ("<name>: element 1e+300 at index (0, 2) overflows float32").
qkv::TensorView<const float> float32_view(const py::handle& obj, const char* name, py::array& owner);

// A forward's lse given back to a backward: float64 as is (the kernel's normalizer before its
// rounding, so P is recomputed exactly), float32 (from elsewhere) widened into `widened`. The view
// keeps the given shape; `owner` holds the array. TypeError for any other dtype or a non-array.
qkv::TensorView<const double> lse_arg(const py::handle& obj, py::array& owner, qkv::Tensor<double>& widened);

// Splits **kwargs of a layer-style call into the mask dictionary and the options scale, kernel,
// num_threads, simd and check_finite. TypeError for an unknown keyword.
struct CallOptions {
  py::dict mask;
  py::object scale = py::none();
  std::string kernel = "auto";
  int num_threads = 0;  // as threads_arg gives it
  std::string simd = "auto";
  bool check_finite = false;
};
CallOptions split_kwargs(const py::kwargs& kwargs, const char* function);

// Fills options.scale, kernel, num_threads and simd from `call` (mask is set separately).
void apply_options(const CallOptions& call, qkv::AttentionOptions& options);

// The shape of a numpy array as a vector.
std::vector<int64_t> shape_of(const py::array& a);

// Raises ValueError("<name> contains NaN at index (i, j, ...)") at the first non-finite element
// (with `allow_neg_inf`, the first NaN or +inf: an additive bias masks a pair with -inf, as the
// CLI's --bias allows). Indices are the caller's (numpy) indices.
template <class T>
void check_finite(qkv::TensorView<const T> v, const char* name, bool allow_neg_inf = false);

// The leading dimensions of a [..., N, D] argument of rank 2..4, as (B, H).
struct Lead {
  int64_t B = 1, H = 1;
};
Lead lead_of(const py::array& a, const char* name);

// Checks q [..., N, D], k [..., M, D], v [..., M, Dv] in the caller's terms (same rank 2..4, same
// batch, heads of k a divisor of heads of q) so messages show the shapes the caller passed.
void check_qkv_shapes(const py::array& q, const py::array& k, const py::array& v);

// An integer seed in [0, 2**64): TypeError / ValueError naming `name` otherwise.
uint64_t seed_arg(const py::handle& obj, const std::string& name);

// One attention call in the caller's terms: the common dtype of q, k, v, the shapes of out
// (q.shape[:-1] + (Dv,)) and lse (q.shape[:-1]), the mask and the options.
struct AttentionCall {
  DType dtype = DType::f32;
  std::vector<int64_t> out_shape, lse_shape;
  MaskArgs mask;
  qkv::AttentionOptions options;
};

// Checks q, k, v (numpy arrays of one supported dtype, shapes as in check_qkv_shapes) and builds
// the call. TypeError / ValueError naming the argument.
AttentionCall prepare_call(const py::array& q, const py::array& k, const py::array& v, const CallOptions& options);

// The arrays q, k, v after dtype_of checks, each aligned (see aligned()).
std::array<py::array, 3> qkv_arrays(const py::object& q, const py::object& k, const py::object& v);

// lse [..., N] seen as [B, H, N] (the rank-4 view of [..., N] drops its first dim).
template <class T>
qkv::TensorView<T> lse_view(qkv::TensorView<T> lse);

// An integer argument (Python int or numpy integer, not bool): TypeError naming `name` otherwise
// (also for an array or tensor of rank >= 1), ValueError if it does not fit in int64.
int64_t index_arg(const py::handle& obj, const std::string& name);

// A list-like argument: a sequence or a numpy array of rank >= 1, not a str or bytes (whose
// items are characters and small ints) and not a 0-d array (a scalar).
bool is_list_arg(const py::handle& obj);

// A sequence of integer arguments, each as index_arg ("<name>[i]"); TypeError for a non-sequence.
std::vector<int64_t> index_list_arg(const py::handle& obj, const std::string& name);

// num_threads: an integer in [0, INT_MAX] (0 = default); TypeError / ValueError otherwise.
int threads_arg(const py::handle& obj);

// True or False (or numpy's bool): TypeError "<name> must be True or False, got <repr>" otherwise,
// so no truthy string or list passes as a flag.
bool flag_arg(const py::handle& obj, const std::string& name);

// A str argument: TypeError "<name> must be a string, got <repr>" otherwise; ValueError for a str
// with a lone surrogate, which has no UTF-8 form.
std::string string_arg(const py::handle& obj, const std::string& name);

// A file path: str or os.PathLike (pathlib.Path); TypeError "<name> must be a path, got <repr>".
std::string path_arg(const py::handle& obj, const std::string& name);

// Python's bool or numpy's bool_: a flag, never a number (numpy's bool_ passes PyNumber_Check).
bool is_bool(const py::handle& obj);

// A real number (not bool or str, nor an array or tensor of rank >= 1, whose one element numpy
// and torch would take): TypeError "<name> must be a number, got <repr>" otherwise.
double number_arg(const py::handle& obj, const std::string& name);

// scale: None (the default 1/sqrt(D)) or a number; TypeError "scale must be a number or None".
std::optional<double> scale_arg(const py::handle& obj);

// A view of bf16 bits widened exactly to float32.
qkv::Tensor<float> widen_bf16(const py::array& a, const char* name);

// Releases the GIL for a long call and makes it interruptible: the kernels check a stop flag between
// tasks, and every qkv::InterruptScope::kPollInterval the calling thread re-takes the GIL to run
// Python's signal handlers. If one raises (Ctrl-C: KeyboardInterrupt), the call throws
// qkv::Interrupted with that Python error still set, and module.cpp's translator raises it. Use
// only around calls whose outputs are discarded on an exception (fresh arrays, local state).
class InterruptibleRelease {
 public:
  InterruptibleRelease();

 private:
  // Raises a signal Python recorded while the call was being set up (argument checks run with the
  // GIL held and do not poll), before any work and without waiting for the first poll.
  struct PendingSignals {
    PendingSignals();
  };
  qkv::InterruptScope scope_;  // declared first: outlives the release, so the GIL is held again first
  PendingSignals pending_;
  GilRelease release_;
};

}  // namespace qkvpy
