// Used by the bindings of classes (python/*.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace qkvpy {

namespace py = pybind11;

// Makes cls.__new__(cls) raise TypeError. pybind11 hands out an instance from __new__ alone whose
// C++ object was never constructed, and any method on it read uninitialised memory (a crash for
// KVCache.create). Calling the class still works: type.__call__ takes the tp_new slot, which is
// left as it is; only the __new__ attribute (what cls.__new__, copy and pickle call) changes.
void refuse_bare_new(const py::handle& cls);

}  // namespace qkvpy
