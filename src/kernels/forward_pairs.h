// The forward tile's bf16 pair helpers (forward_tile.h): pairs of bf16 as vdpbf16ps multiplies
// them, the V block a group's tiles share as pairs, and which micro-kernel policy a tile runs.
// Include after a family's <isa>/ops.h.
#pragma once

#include "kernels/microkernel.h"

namespace qkv::kernels {
namespace {

// Two bf16 as one 32-bit pair, the first in the low half (the order vdpbf16ps multiplies).
inline uint32_t pair_bits(bf16 lo, bf16 hi) { return lo.bits | static_cast<uint32_t>(hi.bits) << 16; }

// Which V block the group's shared pairs buffer (forward_slot::v_pack) holds: the tiles of a group
// that fold the same key block in turn pack its V pairs once (forward_group).
struct PackedBlock {
  const void* v = nullptr;
  int64_t nb = 0;
};

// The micro-kernel policy: FloatDot, or the family's bf16 pairs (only families with AVX512_BF16).
template <class Ops, bool Pairs>
struct DotOf {
  using type = FloatDot<Ops>;
};
template <class Ops>
struct DotOf<Ops, true> {
  using type = typename Ops::PairDot;
};

}  // namespace
}  // namespace qkv::kernels
