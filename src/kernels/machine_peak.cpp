// The machine's fp32 FMA, bf16 dot-product and AMX-BF16 tile peaks, measured the way the attention
// kernels would reach them: more independent accumulator chains than latency x issue width, so
// latency never stalls, and no memory traffic. A peak measured too low makes a kernel "reach" more
// than 100%, so every caller takes the best of several runs at the thread count it judges.
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/amx_tiles.h"
#include "kernels/dispatch.h"
#include "qkv/attention_options.h"
#include "qkv/machine_info.h"
#include "qkv/error.h"
#include "qkv/machine.h"

namespace qkv {
namespace {

#if defined(__x86_64__)
// 16 named chains (2 FMA pipes x 4 cycles of latency need 8; bf16 dot products have up to 6 cycles):
// GCC keeps named vectors in registers (an array of vectors would go through memory at -O2). Each
// chain starts from a different value: identical chains would be merged into one by
// common-subexpression elimination, and the "peak" would count work that never runs.
#define QKV_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define QKV_DECLARE(i) __m512 a##i = _mm512_set1_ps(seed + 0.01f * (i));
#define QKV_FMA(i) a##i = _mm512_fmadd_ps(a##i, b, c);
#define QKV_DOT(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
#define QKV_SUM(i) s = _mm512_add_ps(s, a##i);

constexpr int kChains512 = 16;

__attribute__((target("avx512f"), noinline)) float chains_avx512(int64_t iterations, float seed) {
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
  QKV_CHAINS(QKV_DECLARE)
  for (int64_t it = 0; it < iterations; ++it) {
    QKV_CHAINS(QKV_FMA)
  }
  __m512 s = _mm512_setzero_ps();
  QKV_CHAINS(QKV_SUM)
  float lanes[16];  // not _mm512_reduce_add_ps: GCC 12 warns about its undefined pass-through operand
  _mm512_storeu_ps(lanes, s);
  return lanes[0] + lanes[15];
}

// vdpbf16ps: each fp32 lane adds the products of two bf16 pairs (4 flops). Small inputs keep the
// sums finite however long it runs.
__attribute__((target("avx512f,avx512bf16"), noinline)) float chains_bf16(int64_t iterations, float seed) {
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3c00), y = (__m512bh)_mm512_set1_epi16(0x2000);  // 2^-7, 2^-63
  QKV_CHAINS(QKV_DECLARE)
  for (int64_t it = 0; it < iterations; ++it) {
    QKV_CHAINS(QKV_DOT)
  }
  __m512 s = _mm512_setzero_ps();
  QKV_CHAINS(QKV_SUM)
  float lanes[16];
  _mm512_storeu_ps(lanes, s);
  return lanes[0] + lanes[15];
}

// AMX-BF16: four accumulator tiles (each tdpbf16ps is 16 x 16 fp32 lanes x 16 pairs, 16,384
// flops) from two A and two B tiles, as the bf16 forward's 2 x 2 blocks run them. Four
// independent accumulators hide the instruction's latency behind its issue interval. Small inputs
// keep the sums finite however long it runs.
constexpr double kAmxFlopsPerStep = 4 * 16.0 * 16 * 32 * 2;

__attribute__((target("amx-tile,amx-bf16"), noinline)) float chains_amx(int64_t iterations, float seed) {
  alignas(64) uint16_t x[16 * 32], y[16 * 32];
  std::fill(std::begin(x), std::end(x), uint16_t{0x3c00});  // 2^-7
  std::fill(std::begin(y), std::end(y), uint16_t{0x2000});  // 2^-63
  alignas(64) float c[16 * 16];
  std::fill(std::begin(c), std::end(c), seed);
  kernels::load_tile_config();
  _tile_loadd(0, c, 64);
  _tile_loadd(1, c, 64);
  _tile_loadd(2, c, 64);
  _tile_loadd(3, c, 64);
  _tile_loadd(4, x, 64);
  _tile_loadd(5, y, 64);
  _tile_loadd(6, x, 64);
  _tile_loadd(7, y, 64);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  float sum = c[0];
  _tile_stored(3, c, 64);
  _tile_release();
  return sum + c[255];
}
#undef QKV_CHAINS
#undef QKV_DECLARE
#undef QKV_FMA
#undef QKV_DOT
#undef QKV_SUM

// AVX2 has 16 vector registers: 12 chains of two 256-bit vectors' worth (2 x iterations steps),
// plus the two constants.
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
#else
// Other architectures have neither instruction set (peak_isa_available says so); never called.
float chains_avx512(int64_t, float seed) { return seed; }
float chains_avx2(int64_t, float seed) { return seed; }
float chains_bf16(int64_t, float seed) { return seed; }
float chains_amx(int64_t, float seed) { return seed; }
constexpr int kChains512 = 16;
constexpr double kAmxFlopsPerStep = 0;
#endif

}  // namespace

// The instruction sets as MachineInfo defines them, the ones the kernels are chosen by: a peak
// the kernels cannot run at is not the ceiling they are judged against.
bool peak_isa_available(PeakIsa isa) {
  const MachineInfo& m = machine_info();
  switch (isa) {
    case PeakIsa::avx512:
      return m.avx512;
    case PeakIsa::avx512_bf16:
      return m.avx512_bf16;
    case PeakIsa::avx2:
      return m.avx2;
    case PeakIsa::amx_bf16:
      return kernels::cpu_features().amx_bf16;  // the OS's grant and QKV_AMX, as the forward sees them
  }
  return false;
}

const char* peak_isa_name(PeakIsa isa) {
  switch (isa) {
    case PeakIsa::avx512:
      return "AVX-512";
    case PeakIsa::avx512_bf16:
      return "AVX512_BF16";
    case PeakIsa::avx2:
      return "AVX2 with FMA";
    case PeakIsa::amx_bf16:
      return "AMX-BF16";
  }
  return "?";
}

PeakIsa bf16_product_isa(int64_t d, int64_t dv) {
  const bool tiles = d % 32 == 0 && dv % 16 == 0;
  return tiles && peak_isa_available(PeakIsa::amx_bf16) ? PeakIsa::amx_bf16 : PeakIsa::avx512_bf16;
}

double fma_peak_work(int threads, int64_t iterations, PeakIsa isa) {
  // OpenMP cannot report a thread count it cannot create (it crashed at 100000): kMaxThreads, as
  // every attention call.
  if (threads < 1 || threads > kMaxThreads || iterations < 1)
    throw Error(fmt::format("fma_peak_work: threads {} must be in [1, {}] and iterations {} >= 1", threads, kMaxThreads,
                            iterations));
  if (!peak_isa_available(isa)) throw Error(fmt::format("fma_peak_work: this CPU has no {}", peak_isa_name(isa)));
  volatile float sink = 0;
#pragma omp parallel num_threads(threads)
  {
    const float seed = 0.5f + static_cast<float>(omp_get_thread_num());
    const float r = isa == PeakIsa::avx512        ? chains_avx512(iterations, seed)
                    : isa == PeakIsa::avx512_bf16 ? chains_bf16(iterations, seed)
                    : isa == PeakIsa::amx_bf16    ? chains_amx(iterations, seed)
                                                  : chains_avx2(iterations, seed);
#pragma omp critical
    sink = sink + r;
  }
  // Flops per step and thread: 16 lanes x chains x (2 per FMA, 4 per bf16 pair dot product);
  // avx2's 2 x 12 chains of 8 lanes x 2 are 16 x 12 x 2; AMX's four tile products.
  const double per_step = isa == PeakIsa::avx512        ? 16.0 * kChains512 * 2
                          : isa == PeakIsa::avx512_bf16 ? 16.0 * kChains512 * 4
                          : isa == PeakIsa::amx_bf16    ? kAmxFlopsPerStep
                                                        : 16.0 * 12 * 2;
  return per_step * static_cast<double>(iterations) * threads;
}

PeakMeasurement measure_peak(int threads, PeakIsa isa, int repeats, double seconds) {
  if (threads < 1 || threads > kMaxThreads || repeats < 1 || !(seconds > 0))
    throw Error(
        fmt::format("measure_peak: threads {}, repeats {}, seconds {} out of range", threads, repeats, seconds));
  PeakMeasurement m;
  if (!peak_isa_available(isa)) return m;
  auto timed = [&](int64_t iterations) {
    const auto start = std::chrono::steady_clock::now();
    const double flops = fma_peak_work(threads, iterations, isa);
    return flops / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // A short calibration run (it also wakes the threads and the wide units) sets the length.
  const int64_t probe = 200'000;
  const double rate = timed(probe);
  const double per_iteration = fma_peak_work(1, 1, isa) * threads;
  const int64_t iterations = std::max<int64_t>(probe, static_cast<int64_t>(seconds * rate / per_iteration));
  for (int r = 0; r < repeats; ++r) m.rates.push_back(timed(iterations));
  m.best = *std::max_element(m.rates.begin(), m.rates.end());
  m.median = median(m.rates);
  return m;
}

double read_bandwidth(int threads, int64_t bytes, int passes) {
  return probe_read_bandwidth(threads, bytes, passes).best;
}

}  // namespace qkv
