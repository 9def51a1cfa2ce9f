// `qkv bench`'s machine section: what the CPU is, its L3 and cold-cache eviction, and its
// ceilings (fp32 FMA peaks, the bf16 dot-product and AMX tile peaks, read bandwidth by streams per thread),
// measured at each thread count the benchmark uses.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/machine.h"

namespace qkv::cli {

struct MachineFigures {
  int threads = 0;
  PeakMeasurement avx512, avx2, bf16, amx;  // empty where the CPU (or OS) lacks the instruction set
  BandwidthProbe bandwidth;
  // The fp32 peak a kernel on this machine's widest path is held to (AVX-512, else AVX2).
  double fp32_peak() const { return avx512.best > 0 ? avx512.best : avx2.best; }
};

// Measures each thread count in turn: peaks `repeats` runs of about 0.2 s each (best and median),
// bandwidth 2 x repeats + 1 passes per stream count over memory_probe_bytes().
std::vector<MachineFigures> measure_machine(const std::vector<int>& thread_counts, int repeats);

// The lines `qkv bench` prints above its timings; simd: the path the kernels run
// (simd_path_name()).
void print_machine(const std::vector<MachineFigures>& figures, const std::string& simd);

// The same as JSON, for bench/report.py and bench/run.sh (`qkv bench --machine --json FILE`).
nlohmann::json machine_json(const std::vector<MachineFigures>& figures, const std::string& simd);

}  // namespace qkv::cli
