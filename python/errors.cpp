#include "errors.h"

#include <cstring>
#include <string>

#include <pybind11/pybind11.h>

#include "qkv/error.h"
#include "qkv/interrupt.h"
#include "qkv/out_of_memory.h"

namespace py = pybind11;

namespace qkvpy {
namespace {

// Sets a Python exception with qkv's message. A message may quote bytes of a file that are not
// UTF-8 (a word2vec header): they are escaped (\x80), where PyErr_SetString gave an empty message.
PyObject* message_text(const char* what) {
  return PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "backslashreplace");
}

void set_error(PyObject* type, const char* what) {
  PyObject* text = message_text(what);
  if (text == nullptr) {
    PyErr_Clear();
    PyErr_SetString(type, "(undecodable message)");
    return;
  }
  PyErr_SetObject(type, text);
  Py_DECREF(text);
}

// qkv's message names the path for C++ callers and the CLI ("cannot open /x: No such file or
// directory"), and OSError's str appends ": '/x'", so str(e) showed it twice. The path is taken out
// where it stands as a word before a ':' ("cannot open: No such file or directory: '/x'").
std::string without_path(std::string message, const std::string& path) {
  if (path.empty()) return message;
  const std::string lead = path + ": ", inner = " " + path + ":";
  if (message.starts_with(lead)) message.erase(0, lead.size());
  for (std::size_t at = message.find(inner); at != std::string::npos; at = message.find(inner, at))
    message.erase(at, inner.size() - 1);
  return message;
}

// A file that cannot be opened raises what open() raises: OSError(errno, message, filename)
// constructs the subclass for the errno (FileNotFoundError, PermissionError, IsADirectoryError),
// with errno and filename set; the message is qkv's, less the path that OSError adds.
void set_file_error(const qkv::FileError& e) {
  PyObject* text = message_text(without_path(e.what(), e.path()).c_str());
  PyObject* filename = PyUnicode_DecodeFSDefaultAndSize(e.path().data(), static_cast<Py_ssize_t>(e.path().size()));
  PyObject* error = text != nullptr && filename != nullptr
                        ? PyObject_CallFunction(PyExc_OSError, "iOO", e.errnum(), text, filename)
                        : nullptr;
  Py_XDECREF(text);
  Py_XDECREF(filename);
  if (error == nullptr) return;  // the error building it (MemoryError) is set and stands
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error)), error);
  Py_DECREF(error);
}

}  // namespace

void register_error_translator() {
  // qkv::Error is qkv's one exception for bad input; Python callers expect ValueError for it, and
  // OSError for a file that cannot be opened (qkv::FileError).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const qkv::OutOfMemory& e) {
      set_error(PyExc_MemoryError, e.what());
    } catch (const qkv::FileError& e) {
      set_file_error(e);
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
