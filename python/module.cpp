// The compiled core of the qkv package (qkv._qkv). The public, documented API is the pure-Python
// package in python/qkv/, which validates keyword arguments and calls into this module.
#include <cstring>

#include <pybind11/pybind11.h>

#include "bindings.h"
#include "qkv/error.h"
#include "qkv/interrupt.h"
#include "qkv/out_of_memory.h"
#include "qkv/version.h"

namespace py = pybind11;

namespace {

// Sets a Python exception with qkv's message. A message may quote bytes of a file that are not
// UTF-8 (a word2vec header): they are escaped (\x80), where PyErr_SetString gave an empty message.
void set_error(PyObject* type, const char* what) {
  PyObject* text = PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "backslashreplace");
  if (text == nullptr) {
    PyErr_Clear();
    PyErr_SetString(type, "(undecodable message)");
    return;
  }
  PyErr_SetObject(type, text);
  Py_DECREF(text);
}

}  // namespace

PYBIND11_MODULE(_qkv, m) {
  m.doc() = "Compiled core of qkv; use the qkv package instead.";
  m.attr("__version__") = QKV_VERSION;
  // qkv::Error is qkv's one exception for bad input; Python callers expect ValueError for it.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const qkv::OutOfMemory& e) {
      set_error(PyExc_MemoryError, e.what());
    } catch (const qkv::Interrupted&) {
      // The signal handler's exception (KeyboardInterrupt) is already set: keep it.
      if (PyErr_Occurred() == nullptr) PyErr_SetNone(PyExc_KeyboardInterrupt);
    } catch (const qkv::Error& e) {
      set_error(PyExc_ValueError, e.what());
    } catch (const py::cast_error& e) {
      // An argument of a type pybind11 cannot convert (e.g. tokens=5): a TypeError, not a RuntimeError.
      set_error(PyExc_TypeError, e.what());
    }
  });
  qkvpy::bind_attention(m);
  qkvpy::bind_backward(m);
  qkvpy::bind_varlen(m);
  qkvpy::bind_layer(m);
  qkvpy::bind_embeddings(m);
  qkvpy::bind_explain(m);
  qkvpy::bind_weights(m);
  qkvpy::bind_optim(m);
  qkvpy::bind_cache(m);
  qkvpy::bind_ring(m);
  qkvpy::bind_argument_checks(m);
}
