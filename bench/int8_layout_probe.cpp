// What would an int8 K pool laid out keys-along-lanes buy the decode kernel? A probe for issue
// 12's int8 targets, not part of the build (AVX-512 with VNNI):
//   g++ -O3 -march=native -I src -o /tmp/int8_layout_probe bench/int8_layout_probe.cpp && /tmp/int8_layout_probe
// One thread does one KV head of D1 (D = 128, 4 query rows of a GQA group) on int8 K and V in
// blocks of 64 keys: scores, then P·V in two passes of 64 columns (4 rows x 4 vectors), as
// decode_chunk.h does. No softmax, scales, masks or block table: those cost the same in every
// variant. V is [token][D] in all of them; K is
//   rows:  [token][D], today's pools: lanes along D, 4 rows x 4 keys reduced by the transposing
//          reduction (decode_chunk.h's scores_tile);
//   tiles: [token/16][D][16]: lanes along 16 keys, q broadcast per d, no reduction;
//   vnni:  [token/16][D/4][16][4]: lanes along 16 keys, vpdpbusd against q split into three int8
//          limbs (q ≈ u0·a0 + u1·a1 + u2·a2, 24 bits of q, about fp32's), k + 128 as the unsigned
//          operand, the 128·Σa correction once per row;
//   vnni_pv: K as vnni and V as [token/4][D][4], P·V by vpdpbusd too: each row's 64 weights of a
//          block split into three int8 limbs (units from the block's max |p|), v + 128 unsigned.
// It prints ns per key (one KV head's K and V row, 256 bytes) streaming from 1 GiB pools and
// with the rows in L2, and checks each variant's output against the rows variant. Min of 5 runs.
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "kernels/reduce_lanes_avx512.h"

namespace {

constexpr long kD = 128, kBlock = 64, kAhead = 16;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

using qkv::kernels::reduce_lanes_avx512;  // the kernel's Avx512Decode::reduce_lanes

__m512 widen(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

enum class Layout { rows, tiles, vnni, vnni_pv };

struct Query {
  alignas(64) float q[4][kD];
  // vnni: the limbs of q, four consecutive d per int32, and each limb's unit and 128·Σa.
  alignas(64) int32_t limb[4][3][kD / 4];
  float unit[4][3];
  int32_t bias[4][3];
};

Query make_query() {
  Query qs{};
  std::mt19937 gen(7);
  std::normal_distribution<float> n(0.0f, 0.1f);
  for (auto& row : qs.q)
    for (float& x : row) x = n(gen);
  for (int r = 0; r < 4; ++r) {
    double mx = 0;
    for (float x : qs.q[r]) mx = std::max(mx, std::fabs(double(x)));
    double rest[kD], u = mx / 127;
    for (long d = 0; d < kD; ++d) rest[d] = qs.q[r][d];
    for (int l = 0; l < 3; ++l, u /= 254) {
      int8_t a[kD];
      int32_t sum = 0;
      for (long d = 0; d < kD; ++d) {
        a[d] = static_cast<int8_t>(std::lround(rest[d] / u));
        rest[d] -= a[d] * u;
        sum += a[d];
      }
      std::memcpy(qs.limb[r][l], a, kD);
      qs.unit[r][l] = static_cast<float>(u);
      qs.bias[r][l] = 128 * sum;
    }
  }
  return qs;
}

// Keys [j, j + 16) of K at tile base t into s[r][jj, jj + 16).
template <Layout kL>
__attribute__((always_inline)) inline void scores16(const Query& qs, const int8_t* t, float (*s)[kBlock], long jj) {
  if constexpr (kL == Layout::tiles) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
#pragma GCC unroll 8
    for (long d = 0; d < kD; ++d) {
      const __m512 kv = widen(t + d * 16);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qs.q[r][d]), kv, acc[r]);
    }
    for (int r = 0; r < 4; ++r) _mm512_store_ps(&s[r][jj], acc[r]);
  } else {
    __m512i acc[4][3];
    for (auto& row : acc)
      for (auto& a : row) a = _mm512_setzero_si512();
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 4
    for (long c = 0; c < kD / 4; ++c) {
      const __m512i kq = _mm512_xor_si512(_mm512_loadu_si512(t + c * 64), flip);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r)
#pragma GCC unroll 3
        for (int l = 0; l < 3; ++l) acc[r][l] = _mm512_dpbusd_epi32(acc[r][l], kq, _mm512_set1_epi32(qs.limb[r][l][c]));
    }
    for (int r = 0; r < 4; ++r) {
      __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][0], _mm512_set1_epi32(qs.bias[r][0]))),
                               _mm512_set1_ps(qs.unit[r][0]));
      for (int l = 1; l < 3; ++l)
        x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][l], _mm512_set1_epi32(qs.bias[r][l]))),
                            _mm512_set1_ps(qs.unit[r][l]), x);
      _mm512_store_ps(&s[r][jj], x);
    }
  }
}

// O rows += P · V for a block of 64 keys, V as [token/4][D][4] at vt.
__attribute__((always_inline)) inline void pv_vnni(float (*s)[kBlock], const int8_t* vt, float (*o)[kD]) {
  alignas(64) int8_t limb[4][3][kBlock];
  float unit[4][3];
  int32_t bias[4][3];
  for (int r = 0; r < 4; ++r) {
    __m512 w[4], mx = _mm512_setzero_ps();
    for (int i = 0; i < 4; ++i) w[i] = _mm512_load_ps(&s[r][16 * i]), mx = _mm512_max_ps(mx, _mm512_abs_ps(w[i]));
    float u = std::max(_mm512_reduce_max_ps(mx), 1e-30f) / 127;
    for (int l = 0; l < 3; ++l, u /= 254) {
      const __m512 inv = _mm512_set1_ps(1 / u), uv = _mm512_set1_ps(u);
      __m512i sum = _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i) {
        const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(w[i], inv));
        w[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(a), uv, w[i]);
        _mm_store_si128(reinterpret_cast<__m128i*>(&limb[r][l][16 * i]), _mm512_cvtepi32_epi8(a));
        sum = _mm512_add_epi32(sum, a);
      }
      unit[r][l] = u;
      bias[r][l] = 128 * _mm512_reduce_add_epi32(sum);
    }
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (long dp = 0; dp < kD; dp += 32) {
    __m512i acc[4][3][2];
    for (auto& row : acc)
      for (auto& l : row) l[0] = l[1] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (long t4 = 0; t4 < kBlock / 4; ++t4) {
      const int8_t* base = vt + t4 * kD * 4 + dp * 4;
      const __m512i v0 = _mm512_xor_si512(_mm512_loadu_si512(base), flip);
      const __m512i v1 = _mm512_xor_si512(_mm512_loadu_si512(base + 64), flip);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r)
#pragma GCC unroll 3
        for (int l = 0; l < 3; ++l) {
          int32_t word;
          std::memcpy(&word, &limb[r][l][4 * t4], 4);
          const __m512i b = _mm512_set1_epi32(word);
          acc[r][l][0] = _mm512_dpbusd_epi32(acc[r][l][0], v0, b);
          acc[r][l][1] = _mm512_dpbusd_epi32(acc[r][l][1], v1, b);
        }
    }
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 2; ++c) {
        __m512 x = _mm512_load_ps(&o[r][dp + 16 * c]);
        for (int l = 0; l < 3; ++l)
          x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][l][c], _mm512_set1_epi32(bias[r][l]))),
                              _mm512_set1_ps(unit[r][l]), x);
        _mm512_store_ps(&o[r][dp + 16 * c], x);
      }
  }
}

// Reads `keys` keys; rows wrap at `wrap` (a power of two: a small one keeps them in L2).
template <Layout kL>
__attribute__((noinline)) float run(const Query& qs, const int8_t* k, const int8_t* v, long keys, long wrap) {
  alignas(64) static float s[4][kBlock];
  alignas(64) static float obuf[4][kD];
  std::memset(obuf, 0, sizeof obuf);
  __m512 o[4][8];
  for (auto& row : o)
    for (auto& a : row) a = _mm512_setzero_ps();
  auto at = [&](const int8_t* base, long j) { return base + (j & (wrap - 1)) * kD; };
  for (long j0 = 0; j0 < keys; j0 += kBlock) {
    if constexpr (kL == Layout::rows) {
      for (long j = j0; j < j0 + kBlock; j += 4) {
        for (int x = 0; x < 4; ++x) {
          _mm_prefetch(reinterpret_cast<const char*>(at(k, j + x + kAhead)), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(at(k, j + x + kAhead)) + 64, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(at(v, j + x + kAhead)), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(at(v, j + x + kAhead)) + 64, _MM_HINT_T0);
        }
        __m512 acc[16];
        for (auto& a : acc) a = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (long d = 0; d < kD; d += 16) {
          __m512 kv[4];
          for (int x = 0; x < 4; ++x) kv[x] = widen(at(k, j + x) + d);
          for (int r = 0; r < 4; ++r) {
            const __m512 qv = _mm512_load_ps(&qs.q[r][d]);
            for (int x = 0; x < 4; ++x) acc[4 * r + x] = _mm512_fmadd_ps(qv, kv[x], acc[4 * r + x]);
          }
        }
        alignas(64) float lanes[16];
        _mm512_store_ps(lanes, reduce_lanes_avx512(acc));
        for (int r = 0; r < 4; ++r) std::memcpy(&s[r][j - j0], lanes + 4 * r, 4 * sizeof(float));
      }
    } else {
      for (long j = j0; j < j0 + kBlock; j += 16) {  // a tile of 16 keys is 2 KB, contiguous
        for (int b = 0; b < 16 * kD; b += 64)
          _mm_prefetch(reinterpret_cast<const char*>(at(k, j + kAhead)) + b, _MM_HINT_T0);
        for (int x = 0; x < 16; ++x) {
          _mm_prefetch(reinterpret_cast<const char*>(at(v, j + x + kAhead)), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(at(v, j + x + kAhead)) + 64, _MM_HINT_T0);
        }
        scores16<kL == Layout::tiles ? Layout::tiles : Layout::vnni>(qs, at(k, j), s, j - j0);
      }
    }
    if constexpr (kL == Layout::vnni_pv) {
      pv_vnni(s, at(v, j0), obuf);
      continue;
    }
    for (int half = 0; half < 2; ++half)
      for (long j = j0; j < j0 + kBlock; ++j) {
        __m512 vv[4];
        for (int c = 0; c < 4; ++c) vv[c] = widen(at(v, j) + 64 * half + 16 * c);
        for (int r = 0; r < 4; ++r) {
          const __m512 p = _mm512_set1_ps(s[r][j - j0]);
          for (int c = 0; c < 4; ++c) o[r][4 * half + c] = _mm512_fmadd_ps(p, vv[c], o[r][4 * half + c]);
        }
      }
  }
  alignas(64) float lanes[16];
  float sum = 0;
  for (auto& row : obuf)
    for (float x : row) sum += x;
  for (auto& row : o)
    for (auto& a : row) {
      _mm512_store_ps(lanes, a);
      for (float x : lanes) sum += x;
    }
  return sum;
}

// K of `keys` tokens (a multiple of 16) in the layout kL, from the rows k (vnni_pv: V's layout).
void relayout(Layout layout, const int8_t* k, int8_t* out, long keys) {
  for (long t = 0; t < keys; t += 16)
    for (long x = 0; x < 16; ++x)
      for (long d = 0; d < kD; ++d) {
        const long at = layout == Layout::tiles  ? d * 16 + x
                        : layout == Layout::vnni ? (d / 4) * 64 + x * 4 + d % 4
                                                 : (x / 4) * kD * 4 + d * 4 + x % 4;
        out[t * kD + at] = k[(t + x) * kD + d];
      }
}

template <Layout kL>
void measure(const char* name, const Query& qs, const int8_t* k, const int8_t* v, long keys, float ref) {
  double stream = 1e9, cached = 1e9;
  float check = 0;
  for (int r = 0; r < 5; ++r) {
    double t0 = now();
    volatile float f = run<kL>(qs, k, v, keys, keys);
    stream = std::min(stream, now() - t0);
    t0 = now();
    f = run<kL>(qs, k, v, keys, 2048);  // 2 x 256 KB
    cached = std::min(cached, now() - t0);
    check = f;
  }
  std::printf("%-7s stream %6.2f ns/key (%5.2f GB/s)  in L2 %6.2f ns/key  output %.6g (rel. diff %.1e)\n", name,
              stream / double(keys) * 1e9, 256.0 * double(keys) / stream / 1e9, cached / double(keys) * 1e9, check,
              ref == 0 ? 0.0 : std::fabs(double(check - ref) / ref));
}

}  // namespace

int main() {
  const long bytes = 1L << 30, keys = bytes / kD;
  auto alloc = [&] {
    auto* p = static_cast<int8_t*>(std::aligned_alloc(1 << 21, bytes));
    madvise(p, bytes, MADV_HUGEPAGE);  // as the cache's pools
    return p;
  };
  int8_t *k = alloc(), *v = alloc(), *kt = alloc();
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> u(-127, 127);
  for (long i = 0; i < bytes; ++i) k[i] = static_cast<int8_t>(u(gen)), v[i] = static_cast<int8_t>(u(gen));
  const Query qs = make_query();
  const float ref = run<Layout::rows>(qs, k, v, keys, 2048);  // what every cached run computes
  measure<Layout::rows>("rows", qs, k, v, keys, ref);
  relayout(Layout::tiles, k, kt, keys);
  measure<Layout::tiles>("tiles", qs, kt, v, keys, ref);
  relayout(Layout::vnni, k, kt, keys);
  measure<Layout::vnni>("vnni", qs, kt, v, keys, ref);
  int8_t* vt = alloc();
  relayout(Layout::vnni_pv, v, vt, keys);
  std::free(v);
  measure<Layout::vnni_pv>("vnni_pv", qs, kt, vt, keys, ref);
}
