#include "errors.h"

#include <cstring>

#include <pybind11/pybind11.h>

#include "qkv/error.h"
#include "qkv/interrupt.h"
#include "qkv/out_of_memory.h"

namespace py = pybind11;

namespace qkvpy {
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

void register_error_translator() {
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
}

}  // namespace qkvpy
