// Sinusoidal positional encoding ("Attention Is All You Need", section 3.5). Self-attention by
// itself is blind to word order (permuting the rows of X permutes the output rows the same way);
// adding PE(pos) to each input row makes the same words in another order give other outputs.
#pragma once

#include <cstdint>

#include "qkv/tensor.h"

namespace qkv {

// PE(pos, 2i) = sin(pos / 10000^(2i/E)), PE(pos, 2i+1) = cos(pos / 10000^(2i/E)); pos counts
// from 0. Evaluated in float64. Requires 0 <= index < E.
double sinusoidal_position(int64_t pos, int64_t index, int64_t E);

// Adds PE(row's position, column) to x in place, x being [N, E] or [B, N, E] (the position is the
// row within its sentence). Each element is rounded once (float64 sum, then float). Throws
// qkv::Error for another rank. Not thread-safe on the same x.
void add_sinusoidal_positions(TensorView<float> x);

}  // namespace qkv
