// The per-thread scratch of the forward, backward and decode tasks (forward_slot in forward.h and
// decode_slot in decode.h name their slots; the backward takes slot 0 of a Workspace of its own
// and lays it out with BackwardLayout).
#pragma once

#include <array>
#include <cstddef>
#include <memory>

namespace qkv::kernels {

// What a thread keeps of a kernel's scratch between calls: a call over tens of thousands of keys
// (the backward's dk and dv sums, decode's partial results of hundreds of sequences) frees its
// larger buffers at its end, whose work dwarfs the allocation, so no thread holds a rare call's
// tens of MB. The backward at S4 (N = M = 4096, D = 64) takes 5.5 MB.
inline constexpr std::size_t kKeptScratchBytes = std::size_t{8} << 20;

// Per-thread scratch buffers that only grow; a thread keeps them across calls, so a steady
// stream of calls allocates nothing.
class Workspace {
 public:
  static constexpr int kSlots = 13;
  // Returns room for at least `count` T (float or uint32_t), 64-byte aligned, in slot `slot`
  // (< kSlots); the previous contents of the slot are not kept.
  template <class T>
  T* get(int slot, std::size_t count) {
    return static_cast<T*>(bytes(slot, count * sizeof(T)));
  }
  // Frees slot `slot` if it holds more than `max_bytes`, so that a thread does not keep a rare
  // call's large buffer between calls.
  void trim(int slot, std::size_t max_bytes);

 private:
  void* bytes(int slot, std::size_t count);
  struct Free {
    void operator()(void* p) const;
  };
  std::array<std::unique_ptr<void, Free>, kSlots> buffers_;
  std::array<std::size_t, kSlots> sizes_{};
};

}  // namespace qkv::kernels
