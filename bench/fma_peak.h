// The machine's fp32 FMA peak, measured the way the attention kernels would reach it: many
// independent FMA chains (so latency never stalls), no memory traffic.
#pragma once

#include <cstdint>

#include "qkv/machine.h"

namespace qkv::bench {

// The widest instruction set the peak can be measured with here (AVX-512, else AVX2).
PeakIsa best_peak_isa();

// Runs `iterations` steps of 16 independent 512-bit (or, without AVX-512, 12 of 2 x 256-bit) FMA
// chains on each of `threads` OpenMP threads; returns the flops done (2 per lane per FMA).
double fma_peak_work(int threads, int64_t iterations);

}  // namespace qkv::bench
