// What this machine is (vendor, family, model, the class its kernels are judged as, the L3 one
// core can fill) and how fast it reads memory: the facts `qkv bench` and `make bench` print above
// every ratio, since each ratio is only as honest as the ceiling it divides by.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qkv {

struct MachineInfo {
  std::string vendor;  // "AuthenticAMD", "GenuineIntel", ... ("" off x86)
  std::string brand;   // the CPU's own name string, trimmed
  int family = 0, model = 0;
  // The class the tables are kept per, e.g. "Zen 5 (full-width AVX-512)", "Zen 4 (double-pumped
  // AVX-512)", "Skylake-SP"; for an Intel model not in the table but with AMX (a hypervisor may
  // report any model) "Intel Xeon with AMX (family 6 model M)"; else "<vendor> family F model M".
  std::string class_name;
  // Each implies the one before, as the kernels take them: avx2 is AVX2 with FMA; avx512 is
  // AVX-512 F, BW, DQ and VL (the subsets qkv's kernels and OpenBLAS's SkylakeX kernels use)
  // beside avx2; avx512_bf16 and avx512_vnni are those extensions beside avx512.
  bool avx2 = false, avx512 = false, avx512_bf16 = false, avx512_vnni = false;
  // The L3 one core can fill (one CCD's on AMD, where a core allocates only in its own), in bytes;
  // 0 if nothing reports it. l3_source says where it came from, and why when a reported size was
  // not taken as it is.
  int64_t l3_bytes = 0;
  std::string l3_source;
  // AMX-TILE and AMX-BF16 in cpuid (whether the OS grants the tile state is the kernels' question).
  // Last, so that every field before it keeps its offset for programs built against the 0.4
  // headers (docs/cpp.md: a layout change would raise the minor version).
  bool amx_bf16 = false;
};

// Reads cpuid and sysfs once; thread-safe.
const MachineInfo& machine_info();

// The maker's class name for (vendor, family, model) and whether the CPU has AVX-512 and AMX-BF16:
// the table behind MachineInfo::class_name, exposed so it can be checked without the CPU at hand.
std::string machine_class_name(const std::string& vendor, int family, int model, bool avx512, bool amx);
// The same without AMX (amx = false): the 0.4 signature, kept for programs built against it.
std::string machine_class_name(const std::string& vendor, int family, int model, bool avx512);

// machine_info().l3_bytes.
int64_t l3_cache_bytes();

// The one rule for a buffer that evicts the caches, or a read that measures memory rather than
// cache: at least 2 x the L3 (l3_cache_bytes) and never less than 256 MiB (the floor also covers
// a system that reports no L3). Benchmarks that want data streamed from memory touch this many
// bytes between two visits of the same data (bench/decode_bench.cpp, `qkv bench --decode`).
int64_t memory_probe_bytes();

// Whether `bytes` read again and again stay in this CPU's caches from one pass to the next: under
// half the L3, since the rest of a step's data and the other cores share it. False when the L3 is
// unknown. Such a pass reads at the cache's rate, so a bound from memory's bandwidth says nothing
// about it (a decode step's hot row in `qkv bench` and qkv_decode_bench).
bool stays_in_cache(double bytes);

// The median of v (not empty, else throws qkv::Error); of an even count the mean of the middle
// two, so one run slowed by the scheduler never stands for both. Every figure qkv bench and the
// benchmarks report as a median is this one.
double median(std::vector<double> v);

// One read-bandwidth measurement: every thread reads its share of one buffer in `streams` equal
// parts at once (1: one sequential stream), `repeats` passes of the whole buffer.
struct StreamRates {
  int streams = 0;
  std::vector<double> rates;  // bytes/s of each pass, in the order run
  double median = 0, min = 0, max = 0;
  double spread() const { return median > 0 ? (max - min) / median : 0.0; }
};

struct BandwidthProbe {
  int threads = 0;
  int64_t bytes = 0;                    // the buffer read per pass
  std::vector<StreamRates> by_streams;  // 1, 2, 4 and 8 streams per thread
  double best = 0;                      // the highest median: the sustained figure a kernel can reach
  int best_streams = 0;
};

// Requires threads >= 1, bytes >= 4096 and repeats >= 1 (else throws qkv::Error). Allocates
// `bytes` (rounded down to whole blocks per thread and stream) as the KV cache's pools are
// (huge pages), writes it once, then runs the stream counts in turn, `repeats` rounds of each in
// alternation, so a slow phase of a shared machine hits every count alike. Thread-safe.
BandwidthProbe probe_read_bandwidth(int threads, int64_t bytes, int repeats);

// The sum of buffer[0, n) (64-byte aligned; n a multiple of 64 x streams x threads, else throws
// qkv::Error) over `threads` OpenMP threads, each reading its share as `streams` parts at once,
// with 512-bit loads where the CPU has them: the probe's read loop, for benchmarks that time it.
float streaming_sum(const float* buffer, int64_t n, int threads, int streams = 1);

}  // namespace qkv
