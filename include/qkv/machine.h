// What this machine can do, measured: the fp32 FMA peak and the memory read bandwidth, the two
// ceilings the attention kernels are judged against (`qkv bench`, bench/).
#pragma once

#include <cstdint>

namespace qkv {

// Instruction sets the FMA peak can be measured with.
enum class PeakIsa { avx512, avx2 };

// Requires threads >= 1, iterations >= 1 and a CPU with `isa` (else throws qkv::Error). Runs
// `iterations` steps of 12 independent FMA chains of one 512-bit vector (avx512) or of two 256-bit
// vectors (avx2) on each of `threads` OpenMP threads; returns the flops done (2 per lane per FMA),
// so flops / seconds is the peak. Thread-safe (uses its own OpenMP team).
double fma_peak_work(int threads, int64_t iterations, PeakIsa isa);

// True if this CPU (and OS) can run `isa`.
bool peak_isa_available(PeakIsa isa);

// Requires threads >= 1 and bytes >= 4096. Reads a buffer of `bytes` (allocated and written once
// here, freed on return) `passes` times, split over `threads` threads; returns the bytes read per
// second of the fastest pass. Thread-safe.
double read_bandwidth(int threads, int64_t bytes, int passes);

}  // namespace qkv
