// What this machine can do, measured: the fp32 FMA peak, the bf16 dot-product peak and the memory
// read bandwidth, the ceilings the attention kernels are judged against (`qkv bench`, bench/).
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/machine_info.h"

namespace qkv {

// What the peak can be measured with: fp32 FMAs on 512-bit (avx512) or 256-bit (avx2) vectors,
// AVX512_BF16's bf16 pair dot products into fp32 (avx512_bf16, `vdpbf16ps`), or AMX-BF16's tile
// products (amx_bf16, `tdpbf16ps`). The bf16 forward's products run on AMX where the CPU and OS
// grant it (and QKV_AMX is not 0), else on vdpbf16ps: bf16_product_isa().
enum class PeakIsa { avx512, avx2, avx512_bf16, amx_bf16 };

// Requires threads >= 1, iterations >= 1 and a CPU with `isa` (else throws qkv::Error). Runs
// `iterations` steps of independent accumulator chains, 16 of one 512-bit vector (avx512,
// avx512_bf16) or 12 of two 256-bit vectors (avx2), more than latency x issue width on any
// current core, or (amx_bf16) four tile products from two A and two B tiles, on each of `threads`
// OpenMP threads; returns the flops done (an FMA: 2 per lane; a bf16 pair dot product: 4 per lane;
// a tile product 16 x 16 x 32 x 2, as the attention FLOP counts count them), so flops / seconds
// is the peak. Thread-safe (uses its own OpenMP team).
double fma_peak_work(int threads, int64_t iterations, PeakIsa isa);

// True if this CPU can run `isa` as the kernels would: AVX-512 is F, BW, DQ and VL beside AVX2
// with FMA (MachineInfo::avx512); AMX-BF16 only once the OS grants the tile state and QKV_AMX is
// not 0; always false off x86.
bool peak_isa_available(PeakIsa isa);

// The instruction the bf16 forward's products run on here for head dims d (q, k) and dv (v), and
// so its rows' ceiling: amx_bf16 where available and d is a multiple of 32 and dv of 16 (whole
// tiles), else avx512_bf16 (which may itself be unavailable: then bf16 runs on fp32 FMAs).
PeakIsa bf16_product_isa(int64_t d, int64_t dv);

// A peak measured `repeats` times (each run about `seconds` long) on `threads` threads: each
// run's flop/s, their best (the ceiling: other load only ever lowers a run) and median. All 0
// where the CPU lacks `isa`. Requires threads >= 1, repeats >= 1, seconds > 0.
struct PeakMeasurement {
  std::vector<double> rates;
  double best = 0, median = 0;
};
PeakMeasurement measure_peak(int threads, PeakIsa isa, int repeats, double seconds);

// Requires threads >= 1, bytes >= 4096 and passes >= 1. probe_read_bandwidth(threads, bytes,
// passes).best: the best stream count's median bytes/s. Pass memory_probe_bytes() to measure the
// memory's bandwidth. Thread-safe.
double read_bandwidth(int threads, int64_t bytes, int passes);

}  // namespace qkv
