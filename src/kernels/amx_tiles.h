// The one AMX tile configuration qkv uses: palette 1, tmm0-7 each 16 rows of 64 bytes (16 fp32
// lanes, or 16 bf16 pairs, per row). The bf16 forward's tile products and the AMX peak probe
// (machine_peak.cpp) load it.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

namespace qkv::kernels {

// Loads the configuration on the calling thread; _tile_release() frees the tile state. Requires a
// CPU with AMX-TILE whose OS granted the tile data (CpuFeatures::amx_bf16). Internal linkage, so
// that a copy compiled inside an ISA folder is never picked for a baseline caller.
__attribute__((target("amx-tile"))) static inline void load_tile_config() {
  struct alignas(64) Config {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  _tile_loadconfig(&config);
}

}  // namespace qkv::kernels
#endif
