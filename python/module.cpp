// The compiled core of the qkv package (qkv._qkv). The public, documented API is the pure-Python
// package in python/qkv/, which validates keyword arguments and calls into this module.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "errors.h"
#include "qkv/version.h"

namespace py = pybind11;

PYBIND11_MODULE(_qkv, m) {
  m.doc() = "Compiled core of qkv; use the qkv package instead.";
  m.attr("__version__") = QKV_VERSION;
  qkvpy::register_error_translator();
  qkvpy::bind_attention(m);
  qkvpy::bind_backward(m);
  qkvpy::bind_varlen(m);
  qkvpy::bind_layer(m);
  qkvpy::bind_embeddings(m);
  qkvpy::bind_explain(m);
  qkvpy::bind_weights(m);
  qkvpy::bind_optim(m);
  qkvpy::bind_cache(m);
  qkvpy::bind_ring(m);
  qkvpy::bind_argument_checks(m);
}
