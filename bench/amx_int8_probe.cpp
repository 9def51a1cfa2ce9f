// What do int8 decode scores on AMX tiles cost per key, against the ~8-9 ns the vector path's
// scores take (decode round 9 in BENCHMARKS.md)? A probe, not part of the build (AMX-INT8 only):
//   g++ -O2 -mamx-tile -mamx-int8 -mavx512f -mavx512bw -o /tmp/amx_int8_probe bench/amx_int8_probe.cpp
//   /tmp/amx_int8_probe
// One thread scores blocks of 64 int8 keys (D = 128, 512 KB of keys: L2) against one tile of
// query columns, as branch exp/decode-amx-int8 does: B (the query's byte planes) resident, four
// A tiles per 32 keys, two C tiles stored per 32 keys. Then, separately timed, the combination of
// the three byte planes into fp32 scores (one vector per key) and the scatter of 4 query rows
// into a row-major score block. Prints ns per key for each stage, cumulated. Min of 5 runs.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

constexpr int kD = 128, kBlocks = 64, kKeys = 64;
alignas(64) int8_t keys[kBlocks * kKeys * kD];
alignas(64) uint8_t planes[2 * 1024];
alignas(64) int32_t c[kKeys * 16];
alignas(64) float combined[kKeys * 16];
alignas(64) float scores[4 * kKeys];

void tiles(const int8_t* a) {
  _tile_loadd(2, planes, 64);
  _tile_loadd(3, planes + 1024, 64);
  for (int g = 0; g < 4; g += 2) {
    const int8_t* a0 = a + g * 16 * kD;
    const int8_t* a1 = a0 + 16 * kD;
    _tile_loadd(4, a0, kD);
    _tile_loadd(5, a0 + 64, kD);
    _tile_loadd(6, a1, kD);
    _tile_loadd(7, a1 + 64, kD);
    _tile_zero(0);
    _tile_zero(1);
    _tile_dpbsud(0, 4, 2);
    _tile_dpbsud(1, 6, 2);
    _tile_dpbsud(0, 5, 3);
    _tile_dpbsud(1, 7, 3);
    _tile_stored(0, c + g * 256, 64);
    _tile_stored(1, c + (g + 1) * 256, 64);
  }
}

void combine() {
  const __m512 rs = _mm512_set1_ps(0x1p-20f), rs_hi = _mm512_set1_ps(0x1p-4f);
  const __m512i last = _mm512_set1_epi32(15);
  for (int j = 0; j < kKeys; ++j) {
    const __m512i p0 = _mm512_load_si512(c + j * 16);
    const __m512i p1 = _mm512_alignr_epi32(p0, p0, 5), p2 = _mm512_alignr_epi32(p0, p0, 10);
    const __m512i high = _mm512_sub_epi32(p2, _mm512_slli_epi32(_mm512_permutexvar_epi32(last, p0), 7));
    const __m512i low = _mm512_add_epi32(p0, _mm512_slli_epi32(p1, 8));
    _mm512_store_ps(combined + j * 16,
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(high), rs_hi, _mm512_mul_ps(_mm512_cvtepi32_ps(low), rs)));
  }
}

void scatter() {
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < kKeys; ++j) scores[r * kKeys + j] = combined[j * 16 + r];
}

double ns_per_key(int stages) {
  constexpr long kReps = 200000;
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long r = 0; r < kReps; ++r) {
      tiles(keys + (r % kBlocks) * kKeys * kD);
      if (stages > 1) combine();
      if (stages > 2) scatter();
    }
    best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  return best / kReps / kKeys;
}

}  // namespace

int main() {
  constexpr int kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) != 0) {
    std::puts("AMX tile data not granted by the OS");
    return 1;
  }
  struct alignas(64) Config {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  _tile_loadconfig(&config);
  std::memset(keys, 3, sizeof keys);
  std::memset(planes, 200, sizeof planes);
  const double t1 = ns_per_key(1), t2 = ns_per_key(2), t3 = ns_per_key(3);
  std::printf("tile products %.2f ns/key; + combine %.2f; + scatter %.2f (check %g)\n", t1, t2, t3, scores[5]);
  _tile_release();
}
