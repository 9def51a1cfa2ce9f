// GCC vector types of a given number of lanes, for the kernels' float64 work written once for
// every family (large_scores.h's sums, row_log.h's log).
#pragma once

#include <algorithm>

namespace qkv::kernels {

// Lanes of T as a GCC vector. A typedef in a struct, not `using`: g++ 12 drops a dependent
// vector_size from an alias declaration and leaves a plain T, whose arithmetic then ran one
// element at a time (S3 with q·50 10x slower on a Zen 5); the static_assert keeps that from
// passing silently.
template <class T, int Lanes>
struct RegisterVector {
  typedef T type __attribute__((vector_size(Lanes * sizeof(T))));
  static_assert(sizeof(type) == Lanes * sizeof(T));
};

// Doubles in one of a family's vector registers (Ops::kLanes floats; at least one double).
template <class Ops>
constexpr int kDoubleLanes = std::clamp(Ops::kLanes / 2, 1, 8);

}  // namespace qkv::kernels
