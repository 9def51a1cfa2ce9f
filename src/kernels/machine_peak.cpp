// The machine's fp32 FMA peak, measured the way the attention kernels would reach it (many
// independent FMA chains, so latency never stalls, and no memory traffic), and its read bandwidth.
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/huge_pages.h"

#include "qkv/error.h"
#include "qkv/machine.h"

namespace qkv {
namespace {

#if defined(__x86_64__)
// 12 named chains: GCC keeps them in registers (an array of vectors would go through memory at
// -O2). Each chain starts from a different value: identical chains would be merged into one by
// common-subexpression elimination, and the "peak" would count FMAs that never run.
__attribute__((target("avx512f"), noinline)) float chains_avx512(int64_t iterations, float seed) {
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
  const __m512 step = _mm512_set1_ps(0.01f);
  __m512 a0 = _mm512_set1_ps(seed), a1 = _mm512_add_ps(a0, step), a2 = _mm512_add_ps(a1, step),
         a3 = _mm512_add_ps(a2, step), a4 = _mm512_add_ps(a3, step), a5 = _mm512_add_ps(a4, step),
         a6 = _mm512_add_ps(a5, step), a7 = _mm512_add_ps(a6, step), a8 = _mm512_add_ps(a7, step),
         a9 = _mm512_add_ps(a8, step), a10 = _mm512_add_ps(a9, step), a11 = _mm512_add_ps(a10, step);
  for (int64_t it = 0; it < iterations; ++it) {
    a0 = _mm512_fmadd_ps(a0, b, c), a1 = _mm512_fmadd_ps(a1, b, c), a2 = _mm512_fmadd_ps(a2, b, c);
    a3 = _mm512_fmadd_ps(a3, b, c), a4 = _mm512_fmadd_ps(a4, b, c), a5 = _mm512_fmadd_ps(a5, b, c);
    a6 = _mm512_fmadd_ps(a6, b, c), a7 = _mm512_fmadd_ps(a7, b, c), a8 = _mm512_fmadd_ps(a8, b, c);
    a9 = _mm512_fmadd_ps(a9, b, c), a10 = _mm512_fmadd_ps(a10, b, c), a11 = _mm512_fmadd_ps(a11, b, c);
  }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  float lanes[16];  // not _mm512_reduce_add_ps: GCC 12 warns about its undefined pass-through operand
  _mm512_storeu_ps(lanes, _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
  return lanes[0] + lanes[15];
}

__attribute__((target("avx2,fma"), noinline)) float chains_avx2(int64_t iterations, float seed) {
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-4f);
  const __m256 step = _mm256_set1_ps(0.01f);
  __m256 a0 = _mm256_set1_ps(seed), a1 = _mm256_add_ps(a0, step), a2 = _mm256_add_ps(a1, step),
         a3 = _mm256_add_ps(a2, step), a4 = _mm256_add_ps(a3, step), a5 = _mm256_add_ps(a4, step),
         a6 = _mm256_add_ps(a5, step), a7 = _mm256_add_ps(a6, step), a8 = _mm256_add_ps(a7, step),
         a9 = _mm256_add_ps(a8, step), a10 = _mm256_add_ps(a9, step), a11 = _mm256_add_ps(a10, step);
  for (int64_t it = 0; it < 2 * iterations; ++it) {
    a0 = _mm256_fmadd_ps(a0, b, c), a1 = _mm256_fmadd_ps(a1, b, c), a2 = _mm256_fmadd_ps(a2, b, c);
    a3 = _mm256_fmadd_ps(a3, b, c), a4 = _mm256_fmadd_ps(a4, b, c), a5 = _mm256_fmadd_ps(a5, b, c);
    a6 = _mm256_fmadd_ps(a6, b, c), a7 = _mm256_fmadd_ps(a7, b, c), a8 = _mm256_fmadd_ps(a8, b, c);
    a9 = _mm256_fmadd_ps(a9, b, c), a10 = _mm256_fmadd_ps(a10, b, c), a11 = _mm256_fmadd_ps(a11, b, c);
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  const __m256 t = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  float lanes[8];
  _mm256_storeu_ps(lanes, t);
  return lanes[0] + lanes[7];
}
// The sum of p[0, n), n a multiple of 64, p 64-byte aligned: 4 independent 512-bit chains, so the
// loads, not the adds, set the pace.
__attribute__((target("avx512f"), noinline)) float sum_avx512(const float* p, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  float lanes[16];
  _mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  float total = 0;
  for (float x : lanes) total += x;
  return total;
}
#else
// Other architectures have neither instruction set (peak_isa_available says so); never called.
float chains_avx512(int64_t, float seed) { return seed; }
float chains_avx2(int64_t, float seed) { return seed; }
float sum_avx512(const float*, int64_t) { return 0; }
#endif

// The same without AVX-512: 8 independent chains the compiler vectorizes.
float sum_plain(const float* p, int64_t n) {
  float s[8] = {};
  for (int64_t i = 0; i < n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += p[i + j];
  float total = 0;
  for (float x : s) total += x;
  return total;
}

}  // namespace

bool peak_isa_available(PeakIsa isa) {
#if defined(__x86_64__)
  return isa == PeakIsa::avx512 ? __builtin_cpu_supports("avx512f") != 0
                                : __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
#else
  (void)isa;
  return false;
#endif
}

double fma_peak_work(int threads, int64_t iterations, PeakIsa isa) {
  if (threads < 1 || iterations < 1)
    throw Error(fmt::format("fma_peak_work: threads {} and iterations {} must be >= 1", threads, iterations));
  if (!peak_isa_available(isa))
    throw Error(fmt::format("fma_peak_work: this CPU has no {}", isa == PeakIsa::avx512 ? "AVX-512" : "AVX2 with FMA"));
  volatile float sink = 0;
#pragma omp parallel num_threads(threads)
  {
    const float seed = 0.5f + static_cast<float>(omp_get_thread_num());
    const float r = isa == PeakIsa::avx512 ? chains_avx512(iterations, seed) : chains_avx2(iterations, seed);
#pragma omp critical
    sink = sink + r;
  }
  return 2.0 * 16 * 12 * static_cast<double>(iterations) * threads;
}

int64_t l3_cache_bytes() {
#if defined(_SC_LEVEL3_CACHE_SIZE)
  const long reported = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (reported > 0) return reported;
#endif
  // sysfs writes e.g. "491520K".
  std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index3/size");
  int64_t size = 0;
  std::string unit;
  if (!(file >> size) || size <= 0) return 0;
  file >> unit;
  if (unit == "K") return size << 10;
  if (unit == "M") return size << 20;
  if (unit == "G") return size << 30;
  return size;
}

int64_t memory_probe_bytes() { return std::max(2 * l3_cache_bytes(), int64_t{256} << 20); }

float streaming_sum(const float* buffer, int64_t n, int threads) {
  if (threads < 1 || n % (64 * threads) != 0)
    throw Error(fmt::format("streaming_sum: n = {} is not a multiple of 64 x {} threads", n, threads));
  const bool avx512 = peak_isa_available(PeakIsa::avx512);
  float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int64_t part = n / threads, begin = part * omp_get_thread_num();
    total += avx512 ? sum_avx512(buffer + begin, part) : sum_plain(buffer + begin, part);
  }
  return total;
}

double read_bandwidth(int threads, int64_t bytes, int passes) {
  if (threads < 1 || bytes < 4096 || passes < 1)
    throw Error(fmt::format("read_bandwidth: threads {}, bytes {}, passes {} out of range", threads, bytes, passes));
  // Whole 64-float blocks per thread (streaming_sum's unit), in memory allocated as the KV
  // cache's pools are, so both see the same TLB reach.
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float)) / (64 * threads) * (64 * threads);
  const detail::HugePageFloats buffer(n, "read_bandwidth buffer");
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) buffer.data()[i] = 1.0f;
  double best = 0;
  volatile float sink = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    const float total = streaming_sum(buffer.data(), n, threads);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    sink = sink + total;
    best = std::max(best, static_cast<double>(n) * sizeof(float) / seconds);
  }
  return best;
}

}  // namespace qkv
