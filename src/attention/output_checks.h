// The check every attention function makes of the views it writes into: each element its own
// place, and no byte shared with an input, since the kernels read inputs after writing outputs
// (out over k or v came back wrong, lse inside out too). Internal.
#pragma once

#include <span>
#include <vector>

#include <fmt/format.h>

#include "qkv/error.h"
#include "qkv/mask.h"
#include "qkv/tensor.h"

namespace qkv::detail {

struct NamedSpan {
  const char* name;
  ByteSpan span;
};

// What an attention call reads: q, k, v (an empty view for none) and the masks' views; a caller
// appends its own extra inputs, then each output it has checked.
template <class T>
std::vector<NamedSpan> read_spans(const TensorView<T>& q, const TensorView<T>& k, const TensorView<T>& v,
                                  const Mask& mask) {
  std::vector<NamedSpan> read{{"q", byte_span(q)},
                              {"k", byte_span(k)},
                              {"v", byte_span(v)},
                              {"the bias", byte_span(mask.bias)},
                              {"the keep mask", byte_span(mask.keep)}};
  read.reserve(read.size() + 5);
  return read;
}

// Throws qkv::Error "<name>: ..." if two elements of `out` may share memory (a stride-0 dimension
// of size > 1, or strides that interleave) or if `out` shares memory with one of `others` (the
// inputs, and the outputs checked before it). An empty view passes.
template <class T>
void require_output(const TensorView<T>& out, const char* name, std::span<const NamedSpan> others) {
  if (out.numel() == 0) return;
  if (may_self_overlap(out))
    throw Error(
        fmt::format("{}: its strides make elements share memory (a stride-0 dimension, or strides that "
                    "interleave); pass a buffer with one place per element",
                    name));
  const ByteSpan span = byte_span(out);
  for (const NamedSpan& other : others)
    if (span.overlaps(other.span))
      throw Error(fmt::format("{}: shares memory with {}; the output needs a buffer of its own", name, other.name));
}

}  // namespace qkv::detail
