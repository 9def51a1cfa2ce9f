// Does this machine overlap a memory stream with compute, and how does that depend on how the
// two streams (K and V) are consumed? A probe for the decode kernel's design, not part of the
// build (AVX-512 only):
//   g++ -O2 -march=native -o /tmp/overlap_probe bench/overlap_probe.cpp && /tmp/overlap_probe [row bytes] [work]
// Two streams of `row bytes` per key (256 = a 128-dim f16 row), `work` independent FMAs per key
// and pass. Keys go in blocks of NB: a first pass reads the block's K rows, a second its V rows
// (the decode kernel's scores, then P·V); NB = 1 reads K and V of each key together. Prefetch
// policies: "kv8" asks for K and V of key j + 8 while reading K of key j (the kernel's cursor
// since round 6); "own8" asks for each pass's own row 8 keys ahead. Each line: ns per key
// streaming from memory (1 GiB per stream), the same with the rows in L2 (compute alone), and the
// stream's rate. One thread; min of 3 runs. BENCHMARKS.md, decode round 7.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

enum Policy { kNone, kKV8, kOwn8 };

__attribute__((always_inline)) inline void prefetch_row(const char* p, long bytes) {
  for (long b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}

// Reads `keys` keys (rows wrap at `wrap`, so a small wrap keeps them in L2).
template <Policy kPol>
__attribute__((noinline)) float run(const char* k, const char* v, long keys, long row, long wrap, long nb, int work) {
  __m512 acc[8];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1.0001f);
  auto at = [&](const char* base, long j) { return base + (j % wrap) * row; };
  auto compute = [&] {
    for (int w = 0; w < work; w += 6)
      for (int i = 2; i < 8; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, x);
  };
  auto read = [&](const char* r, int a) {
    for (long b = 0; b < row; b += 64)
      acc[a] = _mm512_add_ps(acc[a], _mm512_load_ps(reinterpret_cast<const float*>(r + b)));
  };
  for (long j0 = 0; j0 < keys; j0 += nb) {
    for (long j = j0; j < j0 + nb; ++j) {
      if (kPol == kKV8) prefetch_row(at(k, j + 8), row), prefetch_row(at(v, j + 8), row);
      if (kPol == kOwn8) prefetch_row(at(k, j + 8), row);
      read(at(k, j), 0);
      compute();
      if (nb == 1) read(at(v, j), 1), compute();
    }
    for (long j = j0; nb > 1 && j < j0 + nb; ++j) {
      if (kPol == kOwn8) prefetch_row(at(v, j + 8), row);
      read(at(v, j), 1);
      compute();
    }
  }
  __m512 s = acc[0];
  for (int i = 1; i < 8; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: GCC 12's header warns inside it
  _mm512_store_ps(lanes, s);
  float sum = 0.0f;
  for (float x : lanes) sum += x;
  return sum;
}

template <Policy kPol>
void measure(const char* name, const char* k, const char* v, long keys, long row, long nb, int work) {
  double stream = 1e9, cached = 1e9;
  for (int r = 0; r < 3; ++r) {
    double t0 = now();
    volatile float f = run<kPol>(k, v, keys, row, keys, nb, work);
    stream = std::min(stream, now() - t0);
    t0 = now();
    f = run<kPol>(k, v, keys, row, 256 * 1024 / row, nb, work);
    cached = std::min(cached, now() - t0);
    (void)f;
  }
  std::printf("NB=%3ld %-5s work=%3d  stream %6.2f ns/key  in L2 %6.2f ns/key  %5.2f GB/s\n", nb, name, work,
              stream / keys * 1e9, cached / keys * 1e9, 2.0 * row * keys / stream / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const long row = argc > 1 ? std::atol(argv[1]) : 256;
  const int work = argc > 2 ? std::atoi(argv[2]) : 32;
  const long bytes = 1L << 30, keys = bytes / row;
  char* k = static_cast<char*>(std::aligned_alloc(64, bytes));
  char* v = static_cast<char*>(std::aligned_alloc(64, bytes));
  std::memset(k, 1, bytes);
  std::memset(v, 1, bytes);
  measure<kNone>("none", k, v, keys, row, 1, 0);
  for (long nb : {1L, 4L, 8L, 16L, 64L}) {
    measure<kNone>("none", k, v, keys, row, nb, work);
    measure<kKV8>("kv8", k, v, keys, row, nb, work);
    measure<kOwn8>("own8", k, v, keys, row, nb, work);
  }
}
