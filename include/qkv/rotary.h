// Rotary position embeddings (RoPE, Su et al.): each pair of a head vector's first `rotary_dim`
// elements is rotated by the angle pos · theta^(-2p / rotary_dim), p the pair's index, so q·k
// depends on the distance between the two positions only.
#pragma once

#include <cstdint>
#include <span>

#include "qkv/tensor.h"

namespace qkv {

// interleaved: pairs (x[2p], x[2p+1]) (GPT-J, the original paper); half_split: pairs
// (x[p], x[p + rotary_dim/2]) (GPT-NeoX, Llama's Hugging Face layout).
enum class RotaryLayout { interleaved, half_split };

struct RotaryOptions {
  RotaryLayout layout = RotaryLayout::half_split;
  double theta = 10000.0;
  // Elements rotated (even, <= D); 0 means all D. The rest pass through unchanged.
  int64_t rotary_dim = 0;
};

// Rotates x [B, H, N, D] in place (any strides): token n of batch row b sits at position
// offsets[b] + n (offsets: size B, or empty for 0). Angles are computed in float64, so positions
// up to 2^31 keep fp32 accuracy. D = 0 (with rotary_dim 0) leaves nothing to rotate. Throws
// qkv::Error, leaving x unchanged, for a rank other than 4, a negative dimension, no data, strides
// that make elements share memory, an odd or too large rotary_dim, theta <= 0 or so small that an
// angle is infinite, an unknown layout, offsets not one per batch row, an offset that is negative
// or puts a token past position 2^63 - 1, or a finite element the rotation would turn into ±inf
// (past float32's range; NaN and inf elements pass as they are). Thread-safe for distinct x.
void apply_rotary(TensorView<float> x, std::span<const int64_t> offsets, const RotaryOptions& options = {});

}  // namespace qkv
