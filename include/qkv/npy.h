// .npy files (numpy). Readers treat files as untrusted: every fault is a qkv::Error naming the
// file, never a crash, and a declared size larger than the file is refused before allocating.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

// What a .npy header declares. descr is the dtype as numpy writes it (dtype.str), e.g. "<f4" also
// for a header that says 'f4', '=f4' or '|f4' (native order, which numpy reads as little-endian
// here), "|u1" for '<u1'.
struct NpyInfo {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Reads only the header of a .npy file, with the same checks as load_npy (including that the
// file holds exactly the data the header declares).
NpyInfo read_npy_info(const std::string& path);

// Reads a .npy file (format versions 1-3; dtypes <f4, <f8, <f2, |b1, |u1, |i1, <i4, <i8, also
// with '=', '|' or no byte-order character for native order, as numpy reads them) into a contiguous
// tensor of T, converting values. Rank 0-4. The header is read as numpy reads it (a Python
// literal): what numpy refuses is refused (a shape given as a list, escapes that spell no dtype).
// Fortran-order arrays are transposed into row-major. T is float, double or uint8_t. A value T
// cannot hold is refused, not wrapped: a finite double beyond float32's range, or for uint8_t
// anything but an integer 0-255. Big-endian data, a header that does not parse, and a file
// shorter or longer than the header declares are refused before any allocation.
template <class T>
Tensor<T> load_npy(const std::string& path);

// Writes a contiguous copy of `t` as .npy ("<f4" for float, "<f8" for double, "|u1" for
// uint8_t), atomically.
template <class T>
void save_npy(const std::string& path, TensorView<const T> t);

// Serializes to .npy bytes in memory (what save_npy writes).
template <class T>
std::string npy_bytes(TensorView<const T> t);

}  // namespace qkv
