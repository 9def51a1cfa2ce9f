// Internal: parsing and validating the header of a .npy file (shared by load_npy and
// read_npy_info). The header is a Python dict literal and is treated as hostile input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "qkv/npy.h"

namespace qkv::detail {

enum class NpyType { f4, f8, f2, b1, u1, i1, i4, i8 };

struct NpyHeader {
  NpyInfo info;
  NpyType type = NpyType::f4;
  std::size_t item_size = 0;
  std::size_t data_offset = 0;  // where the array data starts in the file
  uint64_t data_bytes = 0;      // numel * item_size, checked against the file's size
};

// Parses the preamble and header dict of `file` (the whole file's bytes) and checks that the
// data it declares is exactly what follows it. Throws qkv::Error prefixed with `path`.
NpyHeader parse_npy_header(std::string_view file, const std::string& path);

// The preamble and header of a version-1.0 C-order .npy file of `shape` (what npy_bytes writes
// before the data, padded so the data starts on a 64-byte boundary).
std::string npy_header_bytes(std::string_view descr, std::span<const int64_t> shape);

}  // namespace qkv::detail
