// .safetensors files (named tensors). Readers treat files as untrusted, as npy.h says.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "qkv/tensor_map.h"

namespace qkv {

// Reads every tensor of a .safetensors file as float32 (F32, F64, F16, BF16 and the integer and
// BOOL dtypes are converted; F8 is refused). `metadata`, if given, receives the "__metadata__"
// string map. The header must be at most 100 MB, nest at most 16 levels and hold at most 2^21
// JSON values (about 200,000 tensors; it is read in time linear in its size), with no key twice
// in one object, and the tensors must tile the data buffer exactly (no overlap, no gap, no
// trailing bytes), as the reference implementation requires. A header starting with a UTF-8
// byte-order mark is refused, as the reference refuses it.
TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Writes named float32 tensors (any strides) and string metadata as .safetensors, atomically:
// F32, names sorted, header padded with spaces to a multiple of 8 bytes. Names must be distinct
// UTF-8 and not "__metadata__".
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, TensorView<const float>>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace qkv
