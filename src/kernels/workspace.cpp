#include "kernels/workspace.h"

#include <cstdlib>

#include "qkv/out_of_memory.h"

namespace qkv::kernels {

void Workspace::Free::operator()(void* p) const { std::free(p); }

void* Workspace::bytes(int slot, std::size_t count) {
  if (sizes_[slot] < count) {
    // 64 spare bytes: vector loads of a tail may read (never use) past the last element.
    const std::size_t rounded = (count + 64 + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) throw OutOfMemory("attention: a thread's scratch buffers", rounded);
    buffers_[slot].reset(p);
    sizes_[slot] = count;
  }
  return buffers_[slot].get();
}

void Workspace::trim(int slot, std::size_t max_bytes) {
  if (sizes_[slot] > max_bytes) {
    buffers_[slot].reset();
    sizes_[slot] = 0;
  }
}

}  // namespace qkv::kernels
