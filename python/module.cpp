// The compiled core of the qkv package (qkv._qkv). The public, documented API is the pure-Python
// package in python/qkv/, which validates keyword arguments and calls into this module.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "qkv/error.h"
#include "qkv/interrupt.h"
#include "qkv/out_of_memory.h"

namespace py = pybind11;

PYBIND11_MODULE(_qkv, m) {
  m.doc() = "Compiled core of qkv; use the qkv package instead.";
  // qkv::Error is qkv's one exception for bad input; Python callers expect ValueError for it.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const qkv::OutOfMemory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const qkv::Interrupted&) {
      // The signal handler's exception (KeyboardInterrupt) is already set: keep it.
      if (PyErr_Occurred() == nullptr) PyErr_SetNone(PyExc_KeyboardInterrupt);
    } catch (const qkv::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const py::cast_error& e) {
      // An argument of a type pybind11 cannot convert (e.g. tokens=5): a TypeError, not a RuntimeError.
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
  qkvpy::bind_attention(m);
  qkvpy::bind_backward(m);
  qkvpy::bind_layer(m);
  qkvpy::bind_embeddings(m);
  qkvpy::bind_explain(m);
  qkvpy::bind_weights(m);
  qkvpy::bind_optim(m);
  qkvpy::bind_cache(m);
  qkvpy::bind_argument_checks(m);
}
