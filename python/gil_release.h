// qkvpy::GilRelease: py::gil_scoped_release for qkv's calls, safe for a daemon thread whose call
// ends while the interpreter exits.
#pragma once

#include <unistd.h>

#include <pybind11/pybind11.h>

namespace qkvpy {

// Whether the interpreter is exiting: a thread other than the one finalizing it that takes the GIL
// then is ended by pthread_exit (CPython 3.11-3.13), and that unwinding through qkv's frames or a
// destructor aborts the process ("terminate called without an active exception").
inline bool interpreter_exiting() { return _Py_IsFinalizing() != 0; }

// Releases the GIL for its lifetime. At its end, while the interpreter exits, it never takes the
// GIL again: the thread (a daemon thread still in a qkv call) waits for the process to end, as
// CPython 3.14 makes such threads do.
class GilRelease {
 public:
  GilRelease() = default;
  ~GilRelease() {
    if (!interpreter_exiting()) return;
    for (;;) ::pause();
  }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  pybind11::gil_scoped_release release_;
};

}  // namespace qkvpy
