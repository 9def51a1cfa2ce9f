// The read-bandwidth probe: one buffer read by every thread as 1, 2, 4 or 8 streams at once. One
// sequential stream per thread leaves the prefetchers a single pattern to follow; several streams
// keep more misses in flight, as the decode kernel does with K and V. Which count is fastest
// differs between CPUs, so the probe reports each and takes the best median as the ceiling.
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include <fmt/format.h>

#include "core/huge_pages.h"
#include "qkv/attention_options.h"
#include "qkv/error.h"
#include "qkv/machine_info.h"

namespace qkv {
namespace {

#if defined(__x86_64__)
// The sum of S parts of p[0, S·len) read at once, 64 floats of each part per step; 4 accumulators,
// so the loads, not the adds, set the pace.
template <int S>
__attribute__((target("avx512f"), noinline)) float sum_avx512(const float* p, int64_t len) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < len; i += 64) {
    for (int s = 0; s < S; ++s) {
      const float* q = p + s * len + i;
      a0 = _mm512_add_ps(a0, _mm512_load_ps(q));
      a1 = _mm512_add_ps(a1, _mm512_load_ps(q + 16));
      a2 = _mm512_add_ps(a2, _mm512_load_ps(q + 32));
      a3 = _mm512_add_ps(a3, _mm512_load_ps(q + 48));
    }
  }
  float lanes[16];
  _mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  float total = 0;
  for (float x : lanes) total += x;
  return total;
}

// The same with 256-bit loads, 8 accumulators (as many adds in flight as AVX2 cores retire).
template <int S>
__attribute__((target("avx2"), noinline)) float sum_avx2(const float* p, int64_t len) {
  __m256 a[8];
  for (__m256& x : a) x = _mm256_setzero_ps();
  for (int64_t i = 0; i < len; i += 64)
    for (int s = 0; s < S; ++s)
      for (int j = 0; j < 8; ++j) a[j] = _mm256_add_ps(a[j], _mm256_load_ps(p + s * len + i + 8 * j));
  for (int j = 1; j < 8; ++j) a[0] = _mm256_add_ps(a[0], a[j]);
  float lanes[8];
  _mm256_storeu_ps(lanes, a[0]);
  float total = 0;
  for (float x : lanes) total += x;
  return total;
}
#endif

// The same on other CPUs: 32 independent sums the compiler keeps in vector registers (each
// accumulator indexed by a constant, so no sum goes through memory), one add per step each.
template <int S>
float sum_plain(const float* p, int64_t len) {
  float acc[32] = {};
  for (int64_t i = 0; i < len; i += 64)
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < 64; h += 32)
        for (int j = 0; j < 32; ++j) acc[j] += p[s * len + i + h + j];
  float total = 0;
  for (float x : acc) total += x;
  return total;
}

// The widest of the three this CPU runs.
enum class SumIsa { avx512, avx2, plain };

template <int S>
float sum_isa(const float* p, int64_t len, SumIsa isa) {
#if defined(__x86_64__)
  if (isa == SumIsa::avx512) return sum_avx512<S>(p, len);
  if (isa == SumIsa::avx2) return sum_avx2<S>(p, len);
#else
  (void)isa;
#endif
  return sum_plain<S>(p, len);
}

float sum_streams(const float* p, int64_t len, int streams, SumIsa isa) {
  switch (streams) {
    case 1:
      return sum_isa<1>(p, len, isa);
    case 2:
      return sum_isa<2>(p, len, isa);
    case 4:
      return sum_isa<4>(p, len, isa);
    default:
      return sum_isa<8>(p, len, isa);
  }
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) throw Error("median of no figures");
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

float streaming_sum(const float* buffer, int64_t n, int threads, int streams) {
  if (streams != 1 && streams != 2 && streams != 4 && streams != 8)
    throw Error(fmt::format("streaming_sum: {} streams per thread (1, 2, 4 or 8)", streams));
  if (threads < 1 || threads > kMaxThreads || n % (int64_t{64} * streams * threads) != 0)
    throw Error(
        fmt::format("streaming_sum: n = {} is not a multiple of 64 x {} streams x {} threads", n, streams, threads));
  const MachineInfo& m = machine_info();
  const SumIsa isa = m.avx512 ? SumIsa::avx512 : m.avx2 ? SumIsa::avx2 : SumIsa::plain;
  float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int64_t part = n / threads, begin = part * omp_get_thread_num();
    total += sum_streams(buffer + begin, part / streams, streams, isa);
  }
  return total;
}

BandwidthProbe probe_read_bandwidth(int threads, int64_t bytes, int repeats) {
  if (threads < 1 || threads > kMaxThreads || bytes < 4096 || repeats < 1)
    throw Error(
        fmt::format("probe_read_bandwidth: threads {}, bytes {}, repeats {} out of range", threads, bytes, repeats));
  constexpr int kCounts[] = {1, 2, 4, 8};
  const int64_t unit = int64_t{64} * 8 * threads;  // whole 64-float blocks for 8 streams per thread
  const int64_t n = std::max(unit, bytes / static_cast<int64_t>(sizeof(float)) / unit * unit);
  // As the KV cache's pools are allocated, so the probe and decode see the same TLB reach.
  const detail::HugePageFloats buffer(n, "read-bandwidth probe buffer");
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) buffer.data()[i] = 1.0f;
  BandwidthProbe probe;
  probe.threads = threads;
  probe.bytes = n * static_cast<int64_t>(sizeof(float));
  for (int streams : kCounts) probe.by_streams.push_back(StreamRates{streams, {}, 0, 0, 0});
  volatile float sink = 0;
  streaming_sum(buffer.data(), n, threads, 1);  // wakes the threads, faults the TLB in
  for (int round = 0; round < repeats; ++round)
    for (StreamRates& r : probe.by_streams) {
      const auto start = std::chrono::steady_clock::now();
      const float total = streaming_sum(buffer.data(), n, threads, r.streams);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      sink = sink + total;
      r.rates.push_back(static_cast<double>(probe.bytes) / seconds);
    }
  for (StreamRates& r : probe.by_streams) {
    r.median = median(r.rates);
    r.min = *std::min_element(r.rates.begin(), r.rates.end());
    r.max = *std::max_element(r.rates.begin(), r.rates.end());
    if (r.median > probe.best) probe.best = r.median, probe.best_streams = r.streams;
  }
  return probe;
}

}  // namespace qkv
