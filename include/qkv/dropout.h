// Attention dropout: which softmax weights a call drops, as a pure function of where they are.
//
// A weight P[b, h, i, j] is kept or dropped by a counter-based generator (Philox4x32-10, Salmon
// et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) keyed by the call's seed and
// counted by (j / 4, i, b·H + h, offset; the offset's high word joins the key): no state passes between elements, so
// the forward, the backward (which regenerates the mask instead of storing it) and any number of threads all see the
// same mask, and a run replays from its seed. Kept weights are scaled by 1 / (1 − p), so the expected output is the
// output without dropout.
#pragma once

#include <array>
#include <cstdint>

namespace qkv {

struct Dropout {
  double p = 0.0;       // probability of dropping a weight, in [0, 1); 0 turns dropout off
  uint64_t seed = 0;    // the generator's key
  uint64_t offset = 0;  // counts calls that share a seed (PyTorch's generator offset)
  // The batch index of the call's batch row 0: calls that each run one part of a larger batch
  // (the sequences of a packed varlen batch) give each part its own mask.
  int64_t first_batch = 0;
  // The index of the call's query row 0 and key 0 in a larger call it is one block of (ring
  // attention's blocks of a sharded sequence), so each block drops what the larger call drops.
  int64_t first_row = 0;
  int64_t first_key = 0;
  bool active() const { return p > 0.0; }
};

// Throws qkv::Error naming `what` unless 0 <= p < 1 (a NaN p included).
void check_dropout(const Dropout& d, const char* what);

// Philox4x32-10 of counter c under key k: four independent 32-bit words. Pure.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k);

// Which weights of one row a call keeps. Cheap to construct; keep(j) is pure and thread-safe.
class DropoutRow {
 public:
  DropoutRow(const Dropout& d, int64_t H, int64_t b, int64_t h, int64_t i);
  // Whether weight (i, j) of the row is kept.
  bool keep(int64_t j) const {
    j += first_key_;
    const uint64_t group = static_cast<uint64_t>(j) >> 2;
    if (group != group_) {
      group_ = group;
      bits_ = philox4x32({static_cast<uint32_t>(group), row_, head_, offset_}, key_);
    }
    return bits_[static_cast<std::size_t>(j & 3)] >= threshold_;
  }

 private:
  int64_t first_key_;
  std::array<uint32_t, 2> key_;
  uint32_t row_, head_, offset_, threshold_;
  mutable uint64_t group_ = ~uint64_t{0};
  mutable std::array<uint32_t, 4> bits_{};
};

// The factor kept weights are multiplied by: 1 / (1 − p), in double.
inline double dropout_scale(const Dropout& d) { return 1.0 / (1.0 - d.p); }

}  // namespace qkv
