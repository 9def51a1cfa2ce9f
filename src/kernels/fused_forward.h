// The fused forward kernel's internal interface: a params struct of pointers and element strides
// (any stride order works, so [B,N,H,D] views cost nothing), the per-thread workspace, and one
// tile function per SIMD family. The driver (fused_forward.cpp) splits the work into tiles of
// query rows and runs them on OpenMP threads; each tile is computed by one thread, start to end.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/mask_eval.h"
#include "qkv/attention_options.h"
#include "qkv/tensor.h"

namespace qkv::kernels {

// Most query tiles one task runs together (ForwardParams::tile_group).
constexpr int64_t kMaxTileGroup = 16;

// q: [B,H,N,D], k: [B,Hkv,M,D], v: [B,Hkv,M,Dv], out: [B,H,N,Dv], lse: [B,H,N] (may be null).
// Exactly one of the fp32 or the bf16 input triples is set.
struct ForwardParams {
  AttentionShape shape;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const bf16* qb = nullptr;
  const bf16* kb = nullptr;
  const bf16* vb = nullptr;
  std::array<int64_t, 4> sq{}, sk{}, sv{}, so{};
  std::array<int64_t, 3> sl{};
  float* out = nullptr;
  float* lse = nullptr;
  float scale = 1.0f;
  const detail::MaskEval* mask = nullptr;
  // Query rows per tile: chosen from the shape alone, never from the thread count, so the
  // reduction order (and so every bit of the result) does not depend on the threads.
  int64_t tile_rows = 64;
  // Tiles per task, run block by block together so they share each K/V block in cache; also
  // from the shape alone.
  int64_t tile_group = 1;
  // bf16 inputs: multiply pairs with vdpbf16ps (AVX512_BF16) instead of widening to fp32.
  bool bf16_dot = false;

  bool is_bf16() const { return qb != nullptr; }
};

// One unit of work: query rows [i0, i0 + tile_group · tile_rows) of head h of batch row b.
struct TileTask {
  int64_t b = 0, h = 0, i0 = 0;
};

// Per-thread scratch buffers that only grow; a thread keeps them across calls, so a steady
// stream of calls allocates nothing.
class Workspace {
 public:
  static constexpr int kSlots = 8;
  // Returns room for at least `count` T (float or uint32_t), 64-byte aligned, in slot `slot`
  // (< kSlots); the previous contents of the slot are not kept.
  template <class T>
  T* get(int slot, std::size_t count) {
    return static_cast<T*>(bytes(slot, count * sizeof(T)));
  }

 private:
  void* bytes(int slot, std::size_t count);
  struct Free {
    void operator()(void* p) const;
  };
  std::array<std::unique_ptr<void, Free>, kSlots> buffers_;
  std::array<std::size_t, kSlots> sizes_{};
};

using TileFn = void (*)(const ForwardParams&, const TileTask&, Workspace&);

// Computes one tile; every family computes the same function (only rounding differs).
void forward_tile_avx512(const ForwardParams& p, const TileTask& task, Workspace& ws);
void forward_tile_avx2(const ForwardParams& p, const TileTask& task, Workspace& ws);
void forward_tile_scalar(const ForwardParams& p, const TileTask& task, Workspace& ws);

// The vectorized 2^x of each family over n values (exposed for its accuracy test).
void exp2_avx512(const float* x, float* y, int64_t n);
void exp2_avx2(const float* x, float* y, int64_t n);
void exp2_scalar(const float* x, float* y, int64_t n);

// Runs the whole forward pass on `num_threads` threads with the given SIMD family.
void fused_forward(const ForwardParams& p, Simd path, int num_threads);

}  // namespace qkv::kernels
