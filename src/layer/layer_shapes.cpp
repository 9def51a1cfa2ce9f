#include "layer/layer_shapes.h"

#include <fmt/format.h>

#include "attention/output_checks.h"

namespace qkv::detail {

LayerDims check_layer_inputs(const LayerConfig& config, TensorView<const float> x, TensorView<const float> kv) {
  const int64_t E = config.embed_dim;
  require_data(x, "layer: x");
  require_data(kv, "layer: kv");
  if (x.rank() != 2 && x.rank() != 3)
    throw Error(
        fmt::format("layer: x must be [N, E] or [B, N, E] with E = {}, got shape {}", E, shape_string(x.shape())));
  if (x.dim(x.rank() - 1) != E)
    throw Error(fmt::format("layer: x has width {} but the layer's embed_dim is {} (shape {})", x.dim(x.rank() - 1), E,
                            shape_string(x.shape())));
  LayerDims d;
  d.batched = x.rank() == 3;
  d.B = d.batched ? x.dim(0) : 1;
  d.N = x.dim(x.rank() - 2);
  d.M = d.N;
  if (kv.rank() == 0) return d;  // no kv: self-attention
  d.cross = true;
  if (kv.rank() != x.rank())
    throw Error(fmt::format("layer: kv must have the same rank as x ({}), got shape {}",
                            d.batched ? "[B, M, E]" : "[M, E]", shape_string(kv.shape())));
  if (kv.dim(kv.rank() - 1) != E)
    throw Error(fmt::format("layer: kv has width {} but the layer's embed_dim is {} (shape {})", kv.dim(kv.rank() - 1),
                            E, shape_string(kv.shape())));
  if (d.batched && kv.dim(0) != d.B)
    throw Error(fmt::format("layer: x has batch {} but kv has batch {}", d.B, kv.dim(0)));
  d.M = kv.dim(kv.rank() - 2);
  return d;
}

bool overlaps(TensorView<const float> v, const Tensor<float>& t) { return byte_span(v).overlaps(byte_span(t.cview())); }

Tensor<float> contiguous_rows(TensorView<const float> t, int64_t B, int64_t rows, int64_t width, const char* what,
                              Tensor<float> into) {
  Tensor<float> out = reuse_or_new(std::move(into), {B, rows, width}, what);
  const TensorView<const float> t3 = t.as_rank4();  // [1, B or 1, rows, width]
  int64_t o = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < width; ++e) out[o++] = t3(0, b, r, e);
  return out;
}

}  // namespace qkv::detail
