// The benchmark shapes S1-S6 [B, H, N, D] (docs/benchmarks.md), shared by the forward (attention_bench.cpp) and
// backward (backward_bench.cpp) benchmarks so both measure the same problems. The Python reports read
// kShapes from this file (bench/shapes.py): keep each entry one {"name", B, H, N, D, causal[, q_scale]}
// of literals.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace qkv::bench {

struct Shape {
  const char* name;
  int64_t B, H, N, D;
  bool causal;
  float q_scale = 1.0f;  // q is N(0, q_scale²), k and v N(0, 1)
};

// S3q50 is S3 with q scaled by 50, as FlashAttention's large-score tests draw it: scores ~±150,
// the case that takes the kernels' second sum in double (src/kernels/large_scores.h) and that
// subnormal weights once made 9x slower. S3q4 (scores ~±12) sits where about half of the scores
// take that sum and they lie too close together for the screen near each row's largest.
inline constexpr Shape kShapes[] = {
    {"S1", 1, 1, 3, 4, false},
    {"S2", 8, 12, 128, 64, false},
    {"S3", 1, 12, 1024, 64, false},
    {"S4", 1, 8, 4096, 64, false},
    {"S5", 1, 8, 4096, 64, true},
    {"S6", 1, 1, 16384, 128, false},
    {"S3q50", 1, 12, 1024, 64, false, 50.0f},
    {"S3q4", 1, 12, 1024, 64, false, 4.0f},
};

// The inputs of shape s as Shape says (q N(0, q_scale²), the others N(0, 1)), B·H·N·D floats each,
// drawn in this order from one engine seeded 42: q, k, v, then dout where asked for, so the
// forward's and the backward's benchmarks see the same q, k and v.
inline void draw_inputs(const Shape& s, std::vector<float>& q, std::vector<float>& k, std::vector<float>& v,
                        std::vector<float>* dout = nullptr) {
  const std::size_t n = static_cast<std::size_t>(s.B * s.H * s.N * s.D);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  for (std::vector<float>* x : {&q, &k, &v, dout}) {
    if (x == nullptr) continue;
    x->resize(n);
    for (float& e : *x) e = normal(rng);
  }
  for (float& e : q) e *= s.q_scale;
}

// flops_per_product · B·H·N²·D (4 for the forward, 10 for the backward), half of it under a causal
// mask (FlashAttention's convention).
inline double flops_of(const Shape& s, double flops_per_product) {
  const double f = flops_per_product * s.B * s.H * static_cast<double>(s.N) * s.N * s.D;
  return s.causal ? f / 2 : f;
}

}  // namespace qkv::bench
