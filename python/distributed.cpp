// The compiled part of qkv.distributed: ring attention over an mpi4py communicator. Python passes
// MPI._addressof(comm), the address of the MPI_Comm handle inside the mpi4py object, so any MPI
// whose handles are ints or pointers works. Arrays are one rank's shards, float32 [B, H, n, D].
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bare_new.h"
#include "qkv/distributed.h"

namespace py = pybind11;

namespace {

using Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

qkv::TensorView<const float> view(const Array& a, const char* name) {
  if (a.ndim() != 4) throw qkv::Error(std::string(name) + ": expected a 4-D [B, H, n, D] array");
  return qkv::TensorView<const float>(a.data(),
                                      std::span<const int64_t>(reinterpret_cast<const int64_t*>(a.shape()), 4));
}

Array new_array(std::vector<int64_t> shape) { return Array(std::vector<py::ssize_t>(shape.begin(), shape.end())); }

qkv::TensorView<float> mutable_view(Array& a) {
  return qkv::TensorView<float>(a.mutable_data(),
                                std::span<const int64_t>(reinterpret_cast<const int64_t*>(a.shape()), a.ndim()));
}

MPI_Comm comm_of(uintptr_t address) { return *reinterpret_cast<MPI_Comm*>(address); }

// Mask and options from the keyword arguments the Python wrapper forwards (global positions).
qkv::RingOptions ring_options(bool causal, const std::string& align, std::optional<std::pair<int64_t, int64_t>> window,
                              std::vector<int64_t> key_lengths, std::vector<int64_t> query_lengths,
                              std::vector<float> alibi_slopes, float softcap, std::optional<double> scale,
                              int num_threads, const std::string& sharding) {
  qkv::RingOptions o;
  if (align != "top_left" && align != "bottom_right")
    throw py::value_error("causal_align must be 'top_left' or 'bottom_right', got '" + align + "'");
  if (sharding != "zigzag" && sharding != "contiguous")
    throw py::value_error("sharding must be 'zigzag' or 'contiguous', got '" + sharding + "'");
  const auto a = align == "top_left" ? qkv::CausalAlign::top_left : qkv::CausalAlign::bottom_right;
  if (causal) o.attention.mask.causal = a;
  o.attention.mask.diagonal = a;
  if (window) o.attention.mask.window = qkv::Window{window->first, window->second};
  o.attention.mask.key_lengths = std::move(key_lengths);
  o.attention.mask.query_lengths = std::move(query_lengths);
  o.attention.mask.alibi_slopes = std::move(alibi_slopes);
  o.attention.mask.softcap = softcap;
  o.attention.scale = scale;
  o.attention.num_threads = num_threads;
  o.sharding = sharding == "zigzag" ? qkv::Sharding::zigzag : qkv::Sharding::contiguous;
  return o;
}

}  // namespace

PYBIND11_MODULE(_qkv_distributed, m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const qkv::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.def("ring_options", &ring_options);
  qkvpy::refuse_bare_new(py::class_<qkv::RingOptions>(m, "RingOptions"));
  m.def("forward", [](uintptr_t comm, const Array& q, const Array& k, const Array& v, const qkv::RingOptions& o) {
    const auto qv = view(q, "q"), kv = view(k, "k"), vv = view(v, "v");
    Array out = new_array({qv.dim(0), qv.dim(1), qv.dim(2), vv.dim(3)});
    Array lse = new_array({qv.dim(0), qv.dim(1), qv.dim(2)});
    {
      py::gil_scoped_release release;
      qkv::ring_attention_forward(comm_of(comm), mutable_view(out), mutable_view(lse), qv, kv, vv, o);
    }
    return py::make_tuple(out, lse);
  });
  m.def("backward", [](uintptr_t comm, const Array& dout, const Array& q, const Array& k, const Array& v,
                       const Array& out, const Array& lse, const qkv::RingOptions& o) {
    const auto qv = view(q, "q"), kv = view(k, "k"), vv = view(v, "v");
    if (lse.ndim() != 3) throw qkv::Error("lse: expected a 3-D [B, H, n] array");
    const qkv::TensorView<const float> lv(lse.data(),
                                          std::span<const int64_t>(reinterpret_cast<const int64_t*>(lse.shape()), 3));
    Array dq = new_array({qv.dim(0), qv.dim(1), qv.dim(2), qv.dim(3)});
    Array dk = new_array({kv.dim(0), kv.dim(1), kv.dim(2), kv.dim(3)});
    Array dv = new_array({vv.dim(0), vv.dim(1), vv.dim(2), vv.dim(3)});
    {
      py::gil_scoped_release release;
      qkv::ring_attention_backward(comm_of(comm), mutable_view(dq), mutable_view(dk), mutable_view(dv),
                                   view(dout, "dout"), qv, kv, vv, view(out, "out"), lv, o);
    }
    return py::make_tuple(dq, dk, dv);
  });
  m.def("shard_ranges", [](int64_t length, int ranks, int rank, const std::string& sharding) {
    std::vector<std::pair<int64_t, int64_t>> out;
    const auto s = sharding == "contiguous" ? qkv::Sharding::contiguous : qkv::Sharding::zigzag;
    for (const qkv::TokenRange& r : qkv::shard_ranges(length, ranks, rank, s)) out.emplace_back(r.begin, r.end);
    return out;
  });
}
