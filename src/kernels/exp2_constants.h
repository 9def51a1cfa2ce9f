// The constants of the kernels' base-2 softmax, in one place for every family and kernel:
// p = 2^((s − m)·log2(e)), with 2^x = 2^n · 2^f, n = round(x), |f| <= 1/2.
#pragma once

namespace qkv::kernels {

inline constexpr float kLog2e = 1.44269504088896340736f;

// Cephes' degree-6 exp2f polynomial for 2^f on [-1/2, 1/2], highest degree first (Horner order).
inline constexpr float kExp2Poly[] = {1.535336188319500e-4f,
                                      1.339887440266574e-3f,
                                      9.618437357674640e-3f,
                                      5.550332471162809e-2f,
                                      2.402264791363012e-1f,
                                      6.931472028550421e-1f,
                                      1.0f};

}  // namespace qkv::kernels
