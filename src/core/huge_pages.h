// Buffers that are streamed whole (KV cache pools, the read-bandwidth probe): one rule for how
// they are allocated, so the probe measures memory the way decode reads it. Blocks of 2 MB and
// more are mapped directly, 2 MB aligned, and asked to be backed by transparent huge pages (the
// kernel's THP mode here is "madvise"; decode ran 15% slower on 4 KB pages, one TLB miss every 8
// keys of each of K and V). The mapping is trimmed to the size rounded up to 2 MB. Smaller blocks
// are malloc'd, 64-byte aligned. Contents are uninitialized.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qkv::detail {

// Requires bytes >= 0 (0 allocates a minimal block). Returns the block, or nullptr when the
// system refuses; `mapped` is the mapping's size to give huge_pages_free (0: malloc'd).
void* huge_pages_alloc(int64_t bytes, std::size_t& mapped);
// Frees a block of huge_pages_alloc (p may be null).
void huge_pages_free(void* p, std::size_t mapped);

// Owns a huge_pages_alloc block of floats; throws qkv::OutOfMemory naming `what` when refused.
class HugePageFloats {
 public:
  HugePageFloats(int64_t count, const char* what);
  ~HugePageFloats() { huge_pages_free(data_, mapped_); }
  HugePageFloats(const HugePageFloats&) = delete;
  HugePageFloats& operator=(const HugePageFloats&) = delete;
  float* data() const { return data_; }

 private:
  float* data_ = nullptr;
  std::size_t mapped_ = 0;
};

}  // namespace qkv::detail
