// The check every attention function makes of the views it writes into: each element its own
// place, and no byte shared with an input, since the kernels read inputs after writing outputs
// (out over k or v came back wrong, lse inside out too). Internal.
#pragma once

#include <algorithm>
#include <span>
#include <string_view>
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

// Throws qkv::Error "<name>: ..." for a view with a shape of elements but no data, which every
// check of shapes alone passes. The default view (rank 0, no data) stands for "none" and passes.
template <class T>
void require_data(const TensorView<T>& view, std::string_view name) {
  const auto shape = view.shape();
  if (view.data() == nullptr && view.rank() > 0 && std::find(shape.begin(), shape.end(), 0) == shape.end())
    throw Error(fmt::format("{}: a null data pointer for shape {}", name, shape_string(shape)));
}

// An input's bytes under its name, after require_data.
template <class T>
NamedSpan named_span(const char* name, const TensorView<T>& view) {
  require_data(view, name);
  return {name, byte_span(view)};
}

// What an attention call reads: q, k, v (an empty view for none) and the masks' views; a caller
// appends its own extra inputs (named_span), then each output it has checked.
template <class T>
std::vector<NamedSpan> read_spans(const TensorView<T>& q, const TensorView<T>& k, const TensorView<T>& v,
                                  const Mask& mask) {
  std::vector<NamedSpan> read{named_span("q", q), named_span("k", k), named_span("v", v),
                              named_span("the bias", mask.bias), named_span("the keep mask", mask.keep)};
  read.reserve(read.size() + 5);
  return read;
}

// Throws qkv::Error "<name>: ..." if two elements of `out` may share memory (a stride-0 dimension
// of size > 1, or strides that interleave) or if `out` shares memory with one of `others` (the
// inputs, and the outputs checked before it). An empty view passes.
template <class T>
void require_output(const TensorView<T>& out, const char* name, std::span<const NamedSpan> others) {
  require_data(out, name);
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

// require_output, then `out` joins `seen`, so the outputs checked after it keep off it too.
template <class T>
void add_output(std::vector<NamedSpan>& seen, const TensorView<T>& out, const char* name) {
  require_output(out, name, seen);
  seen.push_back({name, byte_span(out)});
}

}  // namespace qkv::detail
