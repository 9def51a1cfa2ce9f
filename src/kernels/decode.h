// The decode kernel's internal interface: the params, the unit of work, the layout of a task's
// workspace, one tile function per SIMD family (<isa>/decode.cpp, all instantiating
// decode_tile.h), which computes a (sequence, KV head, key chunk) task for every query head of the
// GQA group from one read of the chunk's keys and values, and the driver (decode.cpp), which
// plans the chunks, runs the tasks on threads and merges their partial results.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

#include "kernels/mask_eval.h"
#include "kernels/params.h"
#include "kernels/workspace.h"
#include "qkv/kv_dtype.h"

namespace qkv::kernels {

// The most keys a chunk task reads between the scores and the P·V product (decode_tile.h's
// buffers), and the grain of a chunk's keys.
constexpr int64_t kDecodeBlock = 256;
// How far ahead of the key being scored a task asks for K and V rows (decode_tile.h): 8 KB of
// them (row_bytes: one key's K and V row), within 8 to 64 keys; at D = 128 f32 8 keys, f16 and bf16
// 16, int8 32. On a Zen 5 with 256-key blocks (both builds in one process, bench/decode_ab.cpp, 15
// rounds, medians of the ratios 8 KB / 4 KB), D1 cold at M = 16384 and 32768, one thread: f16
// 0.980-0.985, bf16 0.972-0.978, int8 0.979-0.987; two threads f16 0.977, bf16 0.982, int8 0.987;
// from L3 0.975-1.003. 16 KB (f32 too at 16 keys) moved f32 by +0.0-1.4%, and 2 KB took f16 and
// int8 2-5% longer. The cap keeps tiny rows (D = 1: thousands of keys) from starting the cursor
// past a whole chunk.
constexpr int64_t decode_prefetch_keys(int64_t row_bytes) {
  return std::clamp<int64_t>(8192 / std::max<int64_t>(row_bytes, 1), 8, 64);
}

// Keys per block (decode_tile.h) on the resolved SIMD path. AVX-512 takes kDecodeBlock at every
// row size: a block pays its softmax per row and its O update (O loaded, scaled, stored) once. On a
// Zen 5 (D = 128), 128-key blocks took less time than 64 (four alternating rounds, medians of the
// ratios 128 / 64: with the cache in L2, one thread, f16 0.94, int8 0.94, f32 0.94; cold at D1
// M = 32768, one thread, f16 0.97, int8 0.92, f32 0.98), and 256 less than 128 (both builds in one
// process, bench/decode_ab.cpp, 15-25 rounds, medians of the ratios 256 / 128: D1 cold at
// M = 16384 and 32768, one thread, int8 0.92-0.94, f16 0.97-1.02, bf16 0.97-0.98, f32 0.97-1.00;
// two threads int8 0.92-0.93, f16 0.98-0.99, bf16 0.96; from L3, M = 1024 and 4096, int8 0.98,
// f16 0.96-0.98, bf16 0.96, f32 0.98-1.03), while 16 keys had cost more than they saved (f32 cold,
// D1 47-51% of the read against 52-56% with 64 keys, D8 49-51 against 55-60). 16- or 32-key
// blocks for 16-bit rows alone gain 1-3% on a cold one-thread D1 step (M >= 16384) but lose 3-9%
// at two threads (16 keys) and 1-12% on D8 (8 × 4096), so no count of a step's bytes picks them
// (docs/machines/zen5-decode-ceilings.md).
// Other paths take 64 keys while a block's K and V rows (row_bytes: one key's K and V row) fit in
// 32 KB, the L1 data cache of the smallest core measured; wider rows take blocks of 16 KB, whole
// powers of two of at least 16 keys, so the rows the prefetch cursor brings in for the next keys
// still fit beside them. Zen 3 (AVX2), D1 M = 32768 cold, f32 (1 KB a key): 64-key blocks
// 19.3-20.0 ms per step (1 thread), 32 keys 20.1-20.3, 16 keys 17.2-17.6, 8 keys 18.5-18.9; D8
// 20.7-21.0 → 18.1-18.2. f16 (512 bytes) at 32 keys was 8% slower than at 64.
constexpr int64_t decode_block_keys(int64_t row_bytes, Simd path) {
  constexpr int64_t kNarrow = 64;
  if (path == Simd::avx512) return kDecodeBlock;
  if (row_bytes * kNarrow <= 32768) return kNarrow;
  return std::max<int64_t>(16, static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(16384 / row_bytes))));
}

// q: [B,H,N,D] (strides q_stride); pools as PagedKV. Rows of a task: r = (h - g·G)·N + i for the
// G = H/Hkv query heads h of KV head g and the N queries i.
struct DecodeParams {
  int64_t B = 0, H = 0, Hkv = 0, N = 0, D = 0, Dv = 0, G = 0;
  KVDtype dtype = KVDtype::f32;
  const char* k = nullptr;
  const char* v = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int64_t page_tokens = 0, max_blocks = 0;
  const int32_t* block_table = nullptr;
  const float* q = nullptr;
  Strides q_stride;
  float scale = 1.0f;
  const detail::MaskEval* mask = nullptr;
  int64_t sink_tokens = 0;
  int64_t prefetch_keys = 0;  // decode_prefetch_keys of this cache's rows
  int64_t block_keys = 0;     // decode_block_keys of this cache's rows
  // Row stride of a task's partial O (Dv rounded up to 16 floats).
  int64_t dvp = 0;
};

// The keys query i of sequence b sees: the mask's band [lo, hi) and the StreamingLLM prefix
// [0, prefix_end), which still obeys causality and the length.
struct DecodeBand {
  int64_t lo = 0, hi = 0, prefix_end = 0;
};
inline DecodeBand decode_band(const DecodeParams& p, int64_t b, int64_t i) {
  const detail::KeyBand band = p.mask->band(b, i);
  return {band.lo, band.hi, std::min(p.sink_tokens, band.hi)};
}

// Keys [j0, j1) of sequence b for KV head g. Writes, for each of the G·N rows, the unnormalized
// o [dvp] (row stride p.dvp), the running max m and the sum l (l = 0, m = -inf: no key kept,
// because none was allowed or every score was -inf).
struct DecodeTask {
  int64_t b = 0, g = 0, j0 = 0, j1 = 0;
  // The prefetches may run on to here (>= j1, within the sequence): past j1 when the thread's
  // next task usually takes the keys after j1 (decode.cpp's head-major order).
  int64_t pf_end = 0;
  float* o = nullptr;
  float* m = nullptr;
  float* l = nullptr;
};

// What each slot of a thread's Workspace holds during a decode task (decode_tile.h).
namespace decode_slot {
enum : int {
  q,       // the task's query rows, scaled
  k_wide,  // a block's K rows widened to fp32 (only when D or Dv is not a multiple of the lanes)
  v_wide,  // a block's V rows widened to fp32
  scores,  // S, then P, of the current block
  bands,   // each row's key band and StreamingLLM prefix
  alpha,   // each row's rescaling factor for O
};
}  // namespace decode_slot

using DecodeFn = void (*)(const DecodeParams&, const DecodeTask&, Workspace&);

void decode_tile_avx512(const DecodeParams& p, const DecodeTask& task, Workspace& ws);
void decode_tile_avx2(const DecodeParams& p, const DecodeTask& task, Workspace& ws);
void decode_tile_scalar(const DecodeParams& p, const DecodeTask& task, Workspace& ws);
void decode_tile_neon(const DecodeParams& p, const DecodeTask& task, Workspace& ws);  // AArch64 only

// Runs decode on `num_threads` threads with the given SIMD family and writes out [B,H,N,Dv] and lse
// [B,H,N] (unless empty). seq_lens: B lengths, checked against the cache; sinks: H logits or null.
// The driver sets p.dvp and p.prefetch_keys. Returns false when a row came out non-finite, or
// kept none of the keys its mask keeps (a non-finite q or an fp32 overflow: the caller names the
// cause); out may then be partly written.
[[nodiscard]] bool decode(const DecodeParams& p, const int64_t* seq_lens, const float* sinks, TensorView<float> out,
                          TensorView<float> lse, Simd path, int num_threads);

// For tests: dst[0, n) = the n stored elements at src through the family's widening loads (int8
// unscaled), which must equal the codec's detail::kv_decode_unscaled (core/kv_codec.h).
void decode_widen_avx512(KVDtype dtype, const void* src, int64_t n, float* dst);
void decode_widen_avx2(KVDtype dtype, const void* src, int64_t n, float* dst);
void decode_widen_scalar(KVDtype dtype, const void* src, int64_t n, float* dst);
void decode_widen_neon(KVDtype dtype, const void* src, int64_t n, float* dst);  // AArch64 only

}  // namespace qkv::kernels
