#include "core/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "qkv/out_of_memory.h"

namespace qkv::detail {

namespace {
constexpr std::size_t kHuge = std::size_t{2} << 20;
}  // namespace

void* huge_pages_alloc(int64_t bytes, std::size_t& mapped) {
  const std::size_t size = static_cast<std::size_t>(std::max<int64_t>(bytes, 1));
  mapped = 0;
  if (size < kHuge) return std::aligned_alloc(64, (size + 63) / 64 * 64);
  const std::size_t rounded = (size + kHuge - 1) / kHuge * kHuge;
  void* raw = ::mmap(nullptr, rounded + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + kHuge - 1) / kHuge * kHuge;
  if (aligned > start) ::munmap(raw, aligned - start);
  ::munmap(reinterpret_cast<void*>(aligned + rounded), start + kHuge - aligned);
  ::madvise(reinterpret_cast<void*>(aligned), rounded, MADV_HUGEPAGE);  // advisory: failure leaves 4 KB pages
  mapped = rounded;
  return reinterpret_cast<void*>(aligned);
}

void huge_pages_free(void* p, std::size_t mapped) {
  if (mapped > 0)
    ::munmap(p, mapped);
  else
    std::free(p);
}

HugePageFloats::HugePageFloats(int64_t count, const char* what) {
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  data_ = static_cast<float*>(huge_pages_alloc(bytes, mapped_));
  if (data_ == nullptr) throw OutOfMemory(what, static_cast<std::size_t>(bytes));
}

}  // namespace qkv::detail
