// One registration function per bound concept; module.cpp calls those whose library part is built
// (see python/CMakeLists.txt for how that is decided).
#pragma once

#include <pybind11/pybind11.h>

namespace qkvpy {

void bind_attention(pybind11::module_& m);
void bind_backward(pybind11::module_& m);
void bind_varlen(pybind11::module_& m);
void bind_layer(pybind11::module_& m);
void bind_embeddings(pybind11::module_& m);
void bind_explain(pybind11::module_& m);
void bind_weights(pybind11::module_& m);
void bind_optim(pybind11::module_& m);
void bind_cache(pybind11::module_& m);
// The transport-free ring steps (qkv.torch's ring) and the ring options qkv.distributed shares.
void bind_ring(pybind11::module_& m);
// The argument checks of bind_util.h, for Python code that builds a call itself (qkv.distributed).
void bind_argument_checks(pybind11::module_& m);

}  // namespace qkvpy
