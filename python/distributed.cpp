// The compiled part of qkv.distributed: ring attention over an mpi4py communicator. Python passes
// MPI._addressof(comm), the address of the MPI_Comm handle inside the mpi4py object, so any MPI
// whose handles are ints or pointers works. Arrays are one rank's shards, float32 [B, H, n, D].
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "errors.h"
#include "gil_release.h"
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

}  // namespace

PYBIND11_MODULE(_qkv_distributed, m) {
  // The core module's: pybind11's translators are global, and the last one registered is tried first.
  qkvpy::register_error_translator();
  // RingOptions and shard_ranges are the core module's (qkv._qkv, python/ring.cpp): pybind11 shares
  // the registered type between the two modules.
  m.def("forward", [](uintptr_t comm, const Array& q, const Array& k, const Array& v, const qkv::RingOptions& o) {
    const auto qv = view(q, "q"), kv = view(k, "k"), vv = view(v, "v");
    Array out = new_array({qv.dim(0), qv.dim(1), qv.dim(2), vv.dim(3)});
    Array lse = new_array({qv.dim(0), qv.dim(1), qv.dim(2)});
    {
      qkvpy::GilRelease release;
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
      qkvpy::GilRelease release;
      qkv::ring_attention_backward(comm_of(comm), mutable_view(dq), mutable_view(dk), mutable_view(dv),
                                   view(dout, "dout"), qv, kv, vv, view(out, "out"), lv, o);
    }
    return py::make_tuple(dq, dk, dv);
  });
}
