// Tensor files: .npy (numpy) and .safetensors (named tensors), and atomic file writes. Readers
// treat files as untrusted: every fault is a qkv::Error naming the file, never a crash, and a
// declared size larger than the file is refused before anything is allocated.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

// Writes `bytes` to the output `path` as qkv/output_file.h decides: a regular file (through
// symlinks) is replaced atomically (temporary file beside it, fsync, rename; a replaced file keeps
// its permissions); a character device, FIFO or /dev/stdout is written directly; anything else is
// refused untouched. On failure throws qkv::Error naming `path` and the reason, removes the
// temporary file and leaves a file target as it was. Thread-safe.
void write_file_atomically(const std::string& path, std::string_view bytes);

// What a .npy header declares. descr is numpy's dtype string, e.g. "<f4".
struct NpyInfo {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Reads only the header of a .npy file, with the same checks as load_npy (including that the
// file holds exactly the data the header declares).
NpyInfo read_npy_info(const std::string& path);

// Reads a .npy file (format versions 1-3; dtypes <f4, <f8, <f2, |b1, |u1, |i1, <i4, <i8, with
// '=' for native order) into a contiguous tensor of T, converting values. Rank 0-4.
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

// Named tensors for safetensors files. Order is by name.
using TensorMap = std::map<std::string, Tensor<float>>;

// Reads every tensor of a .safetensors file as float32 (F32, F64, F16, BF16 and the integer and
// BOOL dtypes are converted; F8 is refused). `metadata`, if given, receives the "__metadata__"
// string map. The header must be at most 100 MB, and the tensors must tile the data buffer
// exactly (no overlap, no gap, no trailing bytes), as the reference implementation requires.
TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Writes named float32 tensors (any strides) and string metadata as .safetensors, atomically:
// F32, names sorted, header padded with spaces to a multiple of 8 bytes. Names must be distinct
// UTF-8 and not "__metadata__".
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView<const float>>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace qkv
