// GCC vector types of a given number of lanes, for the kernels' float64 work written once for
// every family (large_scores.h's sums, row_log.h's log).
#pragma once

#include <algorithm>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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

// Eight floats widened to eight doubles. g++ 12 lowers __builtin_convertvector into a 512-bit
// register in halves: the low four converted, the high four extracted, converted and inserted, three
// shuffle-port µops where one vcvtps2pd does; that was most of the time of large_scores_screen.h's
// dot products, the forward's second sums with q·50.
// (Parameters by reference: a 32- or 64-byte vector passed or returned by value changes the ABI in
// the families built without AVX.)
template <class D, class F>
void widen_floats(const F& x, D& out) {
  static_assert(sizeof(F) / sizeof(float) == sizeof(D) / sizeof(double));
#if defined(__AVX512F__)
  if constexpr (sizeof(D) == 64) {
    out = reinterpret_cast<D>(_mm512_cvtps_pd(reinterpret_cast<__m256>(x)));
    return;
  }
#endif
  out = __builtin_convertvector(x, D);
}

}  // namespace qkv::kernels
