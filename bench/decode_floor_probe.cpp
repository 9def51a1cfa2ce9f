// How close can a decode step on this machine come to its roofline bound, with the arithmetic a
// KV head of D1 needs and no more? A probe for the decode kernel's design, built by `make bench`
// as build/bench/qkv_decode_floor_probe (AVX-512) and qkv_decode_floor_probe_avx2 (AVX2 + FMA),
// each with the tiles of its family's kernel (decode_tile.h); or by hand:
//   g++ -std=c++20 -O3 -march=native -pthread -I src -I include -o /tmp/decode_floor_probe bench/decode_floor_probe.cpp
//   && /tmp/decode_floor_probe   (with -DQKV_FLOOR_PROBE_AVX2: the AVX2 form)
// One thread streams two 1 GiB arrays of fp32 rows (K and V, D = 128: 512 bytes a row) in the
// kernel's blocks (decode_block_keys: 256 of these keys on AVX-512, 16 on AVX2), as decode_tile.h
// does: a scores pass (4 query rows x L/4 keys = L accumulators over D, reduced by the kernel's
// transposing reduction and stored), then a P·V pass (4 rows x C vectors at a time over the 128
// columns), with K and V rows asked for 8 keys ahead while scoring, or not; with the V rows also
// read (one byte a line) 2 keys ahead while scoring; and with each key's K and V rows side by side
// in one array (one stream instead of two, a layout qkv's pools do not have). No softmax, masks,
// merge or block table. It prints ns per key (one key = one KV head's 1024 bytes) streaming from
// memory and with the rows in L2, and the stream's rate; the kernel's roofline bound is 1024 bytes
// / the read bandwidth (bench/decode_bench.cpp). Min of 3 runs. docs/benchmarks.md, "Decode".
// Then software prefetches alone against a plain read (prefetch_alone), and last whether the core
// overlaps a stream with the FMAs that consume it, at D1's FMAs per byte (overlap): if it does,
// a step's time up to the longer of its bytes and its arithmetic is the kernel's to win.
// With an argument T > 1 (`/tmp/decode_floor_probe 2`), T threads of one process instead run the
// first variant at once, each on arrays of its own (at most 2 GiB in all), as decode_attention's threads
// stream their own KV heads; it prints their total rate, min of 3. With `--overlap [MiB]` it
// prints only the overlap, as JSON, at 1 and 2 threads and for 32-, 16- and 8-bit rows
// (`make bench` takes it for the decode rows' ceilings, bench/targets.py).
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/decode.h"
#if defined(QKV_FLOOR_PROBE_AVX2)
#include "kernels/avx2/ops.h"
constexpr qkv::Simd kPath = qkv::Simd::avx2;
constexpr const char* kPathName = "avx2";
#else
#include "kernels/avx512/ops.h"
constexpr qkv::Simd kPath = qkv::Simd::avx512;
constexpr const char* kPathName = "avx512";
#endif

namespace {

constexpr long kRow = 128;
constexpr long kBlock = qkv::kernels::decode_block_keys(2 * kRow * sizeof(float), kPath);  // the kernel's

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Wall seconds for `threads` threads at once, thread t running f(t) (a result it returns is kept
// live, so the compiler cannot drop the pass).
template <class F>
double team_seconds(int threads, const F& f) {
  std::vector<std::thread> team;
  const double t0 = now();
  for (int t = 0; t < threads; ++t)
    team.emplace_back([&f, t] {
      volatile float r = f(t);
      (void)r;
    });
  for (std::thread& member : team) member.join();
  return now() - t0;
}

// The family's operations, as its decode kernel has them, and the kernel's tiles: X = L / 4 keys
// of the scores at a time (4 rows x X keys = L accumulators), C vectors of O per row in P·V
// (decode_tile.h's pv_vecs for 4 rows).
#if defined(QKV_FLOOR_PROBE_AVX2)
using Isa = qkv::kernels::Avx2Decode;
constexpr int C = 2;
#else
using Isa = qkv::kernels::Avx512Decode;
constexpr int C = 4;
#endif
using V = Isa::V;
constexpr int L = Isa::kLanes, R = 4, X = L / R;

// Reads `keys` keys; rows wrap at `wrap` (a power of two: a small one keeps them in L2).
// kInterleaved: key j's K row at k + 2·j·kRow and its V row right after it (v unused).
// kTouch: while scoring, a one-byte load from each line of the V rows 2 keys ahead (asked for 8
// keys ahead), so P·V's rows have been read once by the core before P·V reads them.
template <bool kPrefetch, bool kInterleaved, bool kTouch = false>
__attribute__((noinline)) float run(const float* k, const float* v, long keys, long wrap) {
  alignas(64) float q[R][kRow], s[R][kBlock];  // per thread (streams_at_once)
  for (int r = 0; r < R; ++r)
    for (int d = 0; d < kRow; ++d) q[r][d] = 0.001f * static_cast<float>(r + d);
  V o[R * C];
  for (auto& a : o) a = Isa::zero();
  auto row = [&](const float* base, long j) {
    if (kInterleaved) return k + (j & (wrap - 1)) * 2 * kRow + (base == v ? kRow : 0);
    return base + (j & (wrap - 1)) * kRow;
  };
  for (long j0 = 0; j0 < keys; j0 += kBlock) {
    for (long j = j0; j < j0 + kBlock; j += X) {
      if (kPrefetch)
#pragma GCC unroll 4
        for (int x = 0; x < X; ++x)
#pragma GCC unroll 8
          for (int b = 0; b < kRow * 4; b += 64) {
            _mm_prefetch(reinterpret_cast<const char*>(row(k, j + x + 8)) + b, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(row(v, j + x + 8)) + b, _MM_HINT_T0);
          }
      if (kTouch)
#pragma GCC unroll 4
        for (int x = 0; x < X; ++x)
#pragma GCC unroll 8
          for (int e = 0; e < kRow; e += 64 / 4) (void)*reinterpret_cast<const volatile char*>(row(v, j + x + 2) + e);
      V acc[L];
#pragma GCC unroll 16
      for (auto& a : acc) a = Isa::zero();
#pragma GCC unroll 16
      for (int d = 0; d < kRow; d += L) {
        V kv[X];
#pragma GCC unroll 4
        for (int x = 0; x < X; ++x) kv[x] = Isa::load(row(k, j + x) + d);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const V qv = Isa::load(&q[r][d]);
#pragma GCC unroll 4
          for (int x = 0; x < X; ++x) acc[X * r + x] = Isa::fma(qv, kv[x], acc[X * r + x]);
        }
      }
      alignas(64) float lanes[L];
      Isa::store(lanes, Isa::reduce_lanes(acc));
      for (int r = 0; r < R; ++r) std::memcpy(&s[r][j - j0], lanes + X * r, X * sizeof(float));
    }
    for (int e = 0; e < kRow; e += C * L)
      for (long j = j0; j < j0 + kBlock; ++j) {
        V vv[C];
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) vv[c] = Isa::load(row(v, j) + e + L * c);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const V p = Isa::set1(s[r][j - j0]);
#pragma GCC unroll 4
          for (int c = 0; c < C; ++c) o[C * r + c] = Isa::fma(p, vv[c], o[C * r + c]);
        }
      }
  }
  V t = o[0];
  for (int i = 1; i < R * C; ++i) t = Isa::add(t, o[i]);
  alignas(64) float lanes[L];
  Isa::store(lanes, t);
  float sum = 0;
  for (float x : lanes) sum += x;
  return sum;
}

template <bool kPrefetch, bool kInterleaved, bool kTouch = false>
void measure(const float* k, const float* v, long keys) {
  double stream = 1e9, cached = 1e9;
  for (int r = 0; r < 3; ++r) {
    double t0 = now();
    volatile float f = run<kPrefetch, kInterleaved, kTouch>(k, v, keys, keys);
    stream = std::min(stream, now() - t0);
    t0 = now();
    f = run<kPrefetch, kInterleaved, kTouch>(k, v, keys, 512);  // 2 x 256 KB
    cached = std::min(cached, now() - t0);
    (void)f;
  }
  std::printf("%-11s prefetch %-3s  stream %6.2f ns/key (%5.2f GB/s)  in L2 %6.2f ns/key\n",
              kInterleaved ? "interleaved"
              : kTouch     ? "V touched"
                           : "two arrays",
              kPrefetch ? "yes" : "no", stream / static_cast<double>(keys) * 1e9,
              1024.0 * static_cast<double>(keys) / stream / 1e9, cached / static_cast<double>(keys) * 1e9);
}

// Whether the core overlaps arithmetic with a stream it consumes: every vector of each KB of a
// 1 GiB array is loaded and multiplied into kChains accumulator chains, kFmas FMAs a KB (each
// vector kFmas / kVecs times, the repeats from L1). kFmas = kVecs is the stream alone, nearly
// free of arithmetic; the same FMAs over 16 KB that stays in L1 are the arithmetic alone.
constexpr int kVecs = 1024 / 4 / L, kChains = Isa::kRegisters / 2;

template <int kFmas>
__attribute__((noinline)) float consume(const float* p, long floats, long wrap) {
  V acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = Isa::set1(0.001f * static_cast<float>(c));
  const V m = Isa::set1(0.999f);
  for (long i = 0; i < floats; i += 256) {
    const float* kb = p + (i & (wrap - 1));
#pragma GCC unroll 64
    for (int f = 0; f < kFmas; f += kChains)
#pragma GCC unroll 16
      for (int c = 0; c < kChains; ++c) acc[c] = Isa::fma(Isa::load(kb + L * ((f + c) % kVecs)), m, acc[c]);
  }
  V t = acc[0];
  for (int c = 1; c < kChains; ++c) t = Isa::add(t, acc[c]);
  alignas(64) float lanes[L];
  Isa::store(lanes, t);
  return lanes[0];
}

// kFmas a KB: D1's intensity for a cache of `bytes_per_value` (64 FMAs of 16 lanes per KV head
// and key, over 2 · 128 values), in FMAs of this family's L lanes.
template <int kBytesPerValue>
constexpr int kFmasFor = 64 * 16 / L * 1024 / (2 * 128 * kBytesPerValue);

// The three passes of overlap(), in ns a KB per thread: each of `arrays.size()` threads at once
// consumes an array of its own (`bytes` each). The passes take turns, five rounds, and each keeps
// its fastest, so a slow phase of the host lands on all three rather than on one.
struct Overlap {
  double both = 1e9, stream = 1e9, fmas = 1e9;
  double factor() const { return both / std::max(stream, fmas); }  // 1: a full overlap
};

template <int kBytesPerValue>
Overlap overlap_of(const std::vector<float*>& arrays, long bytes) {
  constexpr int kFmas = kFmasFor<kBytesPerValue>;
  static_assert(kFmas % kChains == 0 && kFmas >= kVecs);
  const long floats = bytes / 4;
  const int threads = static_cast<int>(arrays.size());
  auto time = [&](double& best, auto call) {
    const double seconds = team_seconds(threads, [&](int t) { return call(arrays[t]); });
    best = std::min(best, seconds / static_cast<double>(floats / 256) * 1e9);
  };
  Overlap o;
  for (int r = 0; r < 5; ++r) {
    time(o.both, [&](const float* p) { return consume<kFmas>(p, floats, floats); });
    time(o.stream, [&](const float* p) { return consume<kVecs>(p, floats, floats); });
    time(o.fmas, [&](const float* p) { return consume<kFmas>(p, floats, 4096); });
  }
  return o;
}

template <int kBytesPerValue>
void overlap(float* p, long bytes) {
  const Overlap o = overlap_of<kBytesPerValue>({p}, bytes);
  std::printf(
      "a stream consumed by %d FMAs a KB (D1's %d-bit rows): %6.2f ns/KB; the stream alone %6.2f, "
      "the FMAs alone %6.2f: %.2fx the longer of the two (their sum: %.2fx)\n",
      kFmasFor<kBytesPerValue>, 8 * kBytesPerValue, o.both, o.stream, o.fmas, o.factor(),
      (o.stream + o.fmas) / std::max(o.stream, o.fmas));
}

// An array of `bytes` in huge pages (as the cache's pools), written once.
float* pool(long bytes) {
  auto* p = static_cast<float*>(std::aligned_alloc(1 << 21, bytes));
  madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 0, bytes);
  return p;
}

// `threads` threads stream K and V arrays of their own at once (prefetch on, two arrays). Each
// array holds a power of two of rows, as run()'s wrap needs, at most 1 GiB over the threads.
void streams_at_once(int threads) {
  const long bytes = static_cast<long>(std::bit_floor(static_cast<unsigned long>((1L << 30) / threads)));
  const long keys = bytes / (kRow * 4);
  std::vector<float*> k(threads), v(threads);
  for (int t = 0; t < threads; ++t) k[t] = pool(bytes), v[t] = pool(bytes);
  double best = 1e9;
  for (int r = 0; r < 3; ++r)
    best = std::min(best, team_seconds(threads, [&](int t) { return run<true, false>(k[t], v[t], keys, keys); }));
  std::printf("%d threads at once, two arrays each, prefetch yes: %.2f GB/s in all\n", threads,
              1024.0 * static_cast<double>(keys) * threads / best / 1e9);
}

// Software prefetches alone, one per line of a 1 GiB array, against a plain read of it (four
// accumulators, so the adds never set the pace), alternating, median of 7 each. A core that held
// every prefetch until its line arrived could issue them no faster than the read runs; one that
// drops what its miss buffers cannot hold finishes the pass far sooner, and then asking for rows
// further ahead cannot put more of them in flight.
void prefetch_alone(const float* p, long bytes) {
  const long n = bytes / 4;
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  std::vector<double> read, ahead;
  for (int r = 0; r < 7; ++r) {
    double t0 = now();
    V acc[4] = {Isa::zero(), Isa::zero(), Isa::zero(), Isa::zero()};
    for (long i = 0; i < n; i += 4 * L)
      for (int a = 0; a < 4; ++a) acc[a] = Isa::add(acc[a], Isa::load(p + i + a * L));
    alignas(64) float lanes[L];
    Isa::store(lanes, Isa::add(Isa::add(acc[0], acc[1]), Isa::add(acc[2], acc[3])));
    volatile float sink = lanes[0];
    (void)sink;
    read.push_back(static_cast<double>(bytes) / (now() - t0) / 1e9);
    t0 = now();
    for (long i = 0; i < n; i += 16) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
    ahead.push_back(static_cast<double>(bytes) / (now() - t0) / 1e9);
  }
  std::printf("1 GiB, 1 thread: a plain read %.2f GB/s; prefetcht0 of every line alone \"reads\" %.2f GB/s\n",
              median(read), median(ahead));
}

// For `make bench`'s decode ceilings (bench/targets.py): overlap() at 1 and 2 threads for the
// 32-, 16- and 8-bit rows, as JSON, each thread on `mib` MiB of its own.
void overlap_json(long mib) {
  const long bytes = mib << 20;
  std::vector<float*> arrays;
  std::printf("{\"path\": \"%s\", \"bytes_per_thread\": %ld, \"overlap\": {", kPathName, bytes);
  for (int t = 1; t <= 2; ++t) {
    arrays.push_back(pool(bytes));
    std::printf("%s\"%d\": {", t > 1 ? ", " : "", t);
    auto one = [&](int bits, const Overlap& o) {
      std::printf(
          "%s\"%d\": {\"factor\": %.4f, \"both_ns_per_KB\": %.3f, \"stream_ns_per_KB\": %.3f, "
          "\"fmas_ns_per_KB\": %.3f}",
          bits == 32 ? "" : ", ", bits, o.factor(), o.both, o.stream, o.fmas);
    };
    one(32, overlap_of<4>(arrays, bytes));
    one(16, overlap_of<2>(arrays, bytes));
    one(8, overlap_of<1>(arrays, bytes));
    std::printf("}");
  }
  std::printf("}}\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--overlap") == 0) {
    long mib = 1024;
    bool whole = true;  // the size is all digits, nothing after them
    if (argc > 2) {
      const char* end = argv[2] + std::strlen(argv[2]);
      const auto [at, ec] = std::from_chars(argv[2], end, mib);
      whole = ec == std::errc() && at == end;
    }
    if (argc > 3 || !whole || mib < 1 || mib > 4096) {
      std::fprintf(stderr, "usage: qkv_decode_floor_probe --overlap [MiB per thread, 1-4096; default 1024]\n");
      return 2;
    }
    overlap_json(mib);
    return 0;
  }
  if (argc > 1 && std::atoi(argv[1]) > 1) {
    streams_at_once(std::atoi(argv[1]));
    return 0;
  }
  const long bytes = 1L << 30, keys = bytes / (kRow * 4) / 2;  // interleaved: both in k
  float* k = pool(bytes);
  float* v = pool(bytes);
  measure<true, false>(k, v, keys);
  measure<true, false, true>(k, v, keys);
  measure<false, false>(k, v, keys);
  measure<true, true>(k, v, keys);
  measure<false, true>(k, v, keys);
  prefetch_alone(k, bytes);
  overlap<4>(k, bytes);
  overlap<2>(k, bytes);
}
