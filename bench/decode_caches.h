// The KV caches the decode benchmarks step through (bench/decode_bench.cpp,
// bench/decode_page_sweep.cpp): D1's layer shape (H = 32, Hkv = 8, D = 128) in pages of any size,
// optionally taken from the pool in shuffled order, and enough independent copies ("layers") that
// a step finds its cache in memory rather than in the L3.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "qkv/decode.h"
#include "qkv/kv_cache.h"
#include "qkv/machine.h"

namespace qkv::bench {

constexpr int64_t kH = 32, kHkv = 8, kD = 128;

// A cache holding sequences of the given lengths; shuffled: its pages are taken from the pool in
// a random order (as after many sequences came and went).
struct Setup {
  std::unique_ptr<KVCache> cache;
  std::vector<int64_t> ids;
  int64_t tokens = 0;
  double step_bytes = 0;  // what one decode step over all of ids reads (decode_step_bytes)
};

// The cache make_cache builds for sequences of `lens` tokens: just enough pages.
inline KVCacheConfig cache_config(KVDtype dtype, const std::vector<int64_t>& lens, int64_t page_tokens) {
  int64_t pages = 0;
  for (int64_t len : lens) pages += (len + page_tokens - 1) / page_tokens;
  return KVCacheConfig{pages, page_tokens, kHkv, kD, kD, dtype};
}

constexpr int64_t kPiece = 1024;  // tokens appended at a time
constexpr int kPieces = 8;        // distinct random pieces, reused (drawing 1 GB took longer than the run)

// kPieces pieces of K or V, uniform in [-2, 2) from the top bits of one 64-bit draw each.
inline std::vector<float> random_pieces(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(static_cast<std::size_t>(kPieces * kPiece * kHkv * kD));
  for (float& e : x) e = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1p-51 - 2.0);
  return x;
}

inline Setup make_cache(KVDtype dtype, const std::vector<int64_t>& lens, int64_t page_tokens, bool shuffled,
                        int layer) {
  static const std::vector<float> k_pieces = random_pieces(7), v_pieces = random_pieces(8);
  Setup s;
  const KVCacheConfig config = cache_config(dtype, lens, page_tokens);
  const int64_t pages = config.num_pages;
  s.cache = std::make_unique<KVCache>(config);
  s.step_bytes = decode_step_bytes(config, lens);
  if (shuffled) {
    std::mt19937_64 rng(100 + layer);
    std::vector<int64_t> decoys(static_cast<std::size_t>(pages));
    std::vector<float> one(kHkv * kD, 0.0f);
    const TensorView<const float> row(one.data(), {1, kHkv, kD});
    for (int64_t& d : decoys) {
      d = s.cache->create();
      s.cache->append(d, row, row);
    }
    std::shuffle(decoys.begin(), decoys.end(), rng);
    for (int64_t d : decoys) s.cache->free(d);
  }
  int64_t piece = layer;
  for (int64_t len : lens) {
    const int64_t id = s.cache->create();
    s.ids.push_back(id);
    for (int64_t t = 0; t < len; t += kPiece, ++piece) {
      const int64_t T = std::min(kPiece, len - t), at = piece % kPieces * kPiece * kHkv * kD;
      s.cache->append(id, TensorView<const float>(k_pieces.data() + at, {T, kHkv, kD}),
                      TensorView<const float>(v_pieces.data() + at, {T, kHkv, kD}));
    }
    s.tokens += len;
  }
  return s;
}

// How many copies of the cache of `lens` a cold run cycles through: enough that more than
// memory_probe_bytes() are read between two visits of one.
inline int cold_layers(KVDtype dtype, const std::vector<int64_t>& lens, int64_t page_tokens) {
  const double step = decode_step_bytes(cache_config(dtype, lens, page_tokens), lens);
  return 1 + static_cast<int>(std::ceil(static_cast<double>(memory_probe_bytes()) / step));
}

}  // namespace qkv::bench
