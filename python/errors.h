// How qkv's C++ exceptions reach Python, for each compiled module of the package (qkv._qkv and
// qkv._qkv_distributed), so both raise the same Python types.
#pragma once

namespace qkvpy {

// Registers with pybind11, for the module being initialized: qkv::OutOfMemory -> MemoryError,
// qkv::FileError -> the OSError open() raises for its errno (FileNotFoundError, ...),
// qkv::Interrupted -> KeyboardInterrupt (the one the signal handler set, if any), any other
// qkv::Error -> ValueError, pybind11's cast_error -> TypeError. Messages that are not UTF-8 are
// escaped (\x80).
void register_error_translator();

}  // namespace qkvpy
