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

// The size of this machine's last-level (L3) cache in bytes, as the system reports it
// (sysconf(_SC_LEVEL3_CACHE_SIZE), else /sys/devices/system/cpu/cpu0/cache/index3/size); 0 if
// unknown.
int64_t l3_cache_bytes();

// The one rule for a read-bandwidth probe that measures memory, not cache: stream at least
// 2 x the L3 (l3_cache_bytes), and never less than 256 MiB (the floor also covers a system that
// reports no L3). Benchmarks that want data streamed from memory also touch this many bytes
// between two visits of the same data (bench/decode_bench.cpp).
int64_t memory_probe_bytes();

// Requires threads >= 1 and bytes >= 4096. Reads a buffer of `bytes` (allocated and written once
// here, freed on return) `passes` times, split over `threads` threads; returns the bytes read per
// second of the fastest pass. Pass memory_probe_bytes() to measure the memory's bandwidth.
// Thread-safe.
double read_bandwidth(int threads, int64_t bytes, int passes);

// The read loop of read_bandwidth, for benchmarks that time it themselves: the sum of
// buffer[0, n) (64-byte aligned; n a multiple of 64 x threads, else throws qkv::Error) over
// `threads` OpenMP threads, with 512-bit loads where the CPU has them.
float streaming_sum(const float* buffer, int64_t n, int threads);

}  // namespace qkv
