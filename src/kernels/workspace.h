// The per-thread scratch of the forward, backward and decode tasks (forward_slot in forward.h and
// decode_slot in decode.h name their slots; the backward takes slot 0 of a Workspace of its own
// and lays it out with BackwardLayout).
#pragma once

#include <array>
#include <cstddef>
#include <memory>

namespace qkv::kernels {

// Per-thread scratch buffers that only grow; a thread keeps them across calls, so a steady
// stream of calls allocates nothing.
class Workspace {
 public:
  static constexpr int kSlots = 12;
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
