// Named tensors: what safetensors files, checkpoints, layers and optimizers exchange.
#pragma once

#include <map>
#include <string>

#include "qkv/tensor.h"

namespace qkv {

// Named tensors for safetensors files. Order is by name.
using TensorMap = std::map<std::string, Tensor<float>>;

}  // namespace qkv
