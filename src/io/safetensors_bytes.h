// Internal: a .safetensors file's bytes, built before anything is written, so a writer can refuse
// every input (names, metadata, shapes, memory) before it touches a file (save_safetensors, and a
// checkpoint before it keeps the previous one).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::detail {

// Refuses what save_safetensors would (names, metadata, shapes, data), without building the bytes.
void check_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorView<const float>>>& tensors,
                       const std::map<std::string, std::string>& metadata);

// The bytes save_safetensors writes; throws qkv::Error "cannot write <path>: ..." for what it
// refuses (qkv::OutOfMemory when the bytes cannot be held).
std::string safetensors_bytes(const std::string& path,
                              const std::vector<std::pair<std::string, TensorView<const float>>>& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace qkv::detail
