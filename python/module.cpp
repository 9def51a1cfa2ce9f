// The compiled core of the qkv package (qkv._qkv). The public, documented API is the pure-Python
// package in python/qkv/, which validates keyword arguments and calls into this module.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "qkv/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_qkv, m) {
  m.doc() = "Compiled core of qkv; use the qkv package instead.";
  // qkv::Error is qkv's one exception for bad input; Python callers expect ValueError for it.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const qkv::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const py::cast_error& e) {
      // An argument of a type pybind11 cannot convert (e.g. tokens=5): a TypeError, not a RuntimeError.
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
  py::list features;
  qkvpy::bind_attention(m);
  features.append("attention");
#ifdef QKV_PY_BACKWARD
  qkvpy::bind_backward(m);
  features.append("backward");
#endif
#ifdef QKV_PY_LAYER
  qkvpy::bind_layer(m);
  features.append("layer");
#endif
#ifdef QKV_PY_EMBEDDINGS
  qkvpy::bind_embeddings(m);
  features.append("embeddings");
#endif
#ifdef QKV_PY_EXPLAIN
  qkvpy::bind_explain(m);
  features.append("explain");
#endif
#ifdef QKV_PY_WEIGHTS
  qkvpy::bind_weights(m);
  features.append("weights");
#endif
#ifdef QKV_PY_OPTIM
  qkvpy::bind_optim(m);
  features.append("optim");
#endif
  m.attr("features") = py::tuple(features);
}
