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

// Writes `bytes` to a temporary file beside `path`, fsyncs it, and renames it over `path`. On
// failure throws qkv::Error and leaves `path` as it was (no partial file is ever visible).
void write_file_atomically(const std::string& path, std::string_view bytes);

// What a .npy header declares. descr is numpy's dtype string, e.g. "<f4".
struct NpyInfo {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Reads only the header of a .npy file.
NpyInfo read_npy_info(const std::string& path);

// Reads a .npy file (format versions 1-3; dtypes <f4, <f8, <f2, |b1, |u1, |i1, <i4, <i8) into a
// contiguous tensor of T, converting values. Rank 0-4.
// Fortran-order arrays are transposed into row-major. T is float, double or uint8_t.
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

// Reads every tensor of a .safetensors file as float32 (F32, F64, F16 and BF16 are converted).
// `metadata`, if given, receives the "__metadata__" string map.
TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Writes named float32 tensors (any strides) and string metadata as .safetensors, atomically.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView<const float>>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace qkv
