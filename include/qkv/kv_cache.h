// KVCache: the keys and values of one attention layer for many sequences, in fixed-size pages
// (vLLM's PagedAttention). Sequences grow a page at a time, fork without copying (pages are
// shared and reference-counted; only a shared, partially filled last page is copied, on the first
// append after the fork) and free their pages back to the pool. A contiguous cache is the special
// case page_tokens = the longest sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "qkv/decode.h"
#include "qkv/rotary.h"
#include "qkv/tensor.h"

namespace qkv {

struct KVCacheConfig {
  int64_t num_pages = 0;  // pool size; the cache holds at most num_pages * page_tokens tokens
  // Tokens per page. 256 by measurement (bench/decode_page_sweep.cpp, docs/benchmarks.md): smaller
  // pages cost a decode step up to about 20-40% at 32k tokens against a contiguous cache, 256 the
  // least of 16-256 (the decode kernel then streams one head's keys a run at a time); the price is
  // up to 255 unused token slots in each sequence's last page.
  int64_t page_tokens = 256;
  int64_t Hkv = 0, D = 0, Dv = 0;
  KVDtype dtype = KVDtype::f32;
};

// The cache's sizes, counted in one place for the cache, `qkv bench` and the decode benchmarks. A
// token takes, in each of its Hkv heads, D + Dv elements of the storage dtype (kv_dtype_bytes) and,
// for a scaled dtype (i8), its key's and its value's fp32 scales. Doubles, so that a configuration
// too large to allocate still has a size to report. Both throw qkv::Error for a dtype outside
// KVDtype (as require_kv_dtype).
//
// Bytes KVCache(config) allocates: its pool in whole pages (pool_bytes()) and an int32 reference
// count and free-list slot per page.
double kv_cache_bytes(const KVCacheConfig& config);
// Bytes one decode step reads from a cache of `config` (num_pages aside) holding sequences of
// `seq_lens` tokens, what the step's roofline divides by the read bandwidth: each sequence's
// tokens (the unused slots of its last page are not read), and its block-table entries (an int32
// per page) and its length (an int64), which the step reads beside the tokens and which are a
// visible share with small pages and narrow heads (pages of one token: 4 bytes of table for each).
// Also throws for page_tokens < 1 or a negative length.
double decode_step_bytes(const KVCacheConfig& config, std::span<const int64_t> seq_lens);

class KVCache {
 public:
  // Allocates the whole pool at once (and nothing else that grows with tokens): num_pages pages
  // of K and V, plus for i8 one fp32 scale per (page, head, slot) for each; pools of 2 MB or more
  // are mapped 2 MB aligned with transparent huge pages requested (sizes rounded up to 2 MB).
  // Throws qkv::Error for a dtype outside KVDtype (require_kv_dtype), a non-positive size, a pool
  // past 2^62 bytes, or when the pool cannot be allocated.
  explicit KVCache(const KVCacheConfig& config);
  ~KVCache();
  KVCache(KVCache&&) noexcept;
  KVCache& operator=(KVCache&&) noexcept;

  const KVCacheConfig& config() const { return config_; }
  // Bytes of the pool (pages and scales): all the cache allocates in proportion to tokens.
  int64_t pool_bytes() const;
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }

  // A new empty sequence; ids are never reused.
  int64_t create();
  // Appends T new tokens: k [T, Hkv, D], v [T, Hkv, Dv], any strides (e.g. the projection's
  // [N, Hkv, D] rows). Values are converted (rounded to nearest) to the storage dtype on write.
  // All or nothing: an unknown id, mismatched or negative dims, a non-finite value (or one the
  // storage dtype rounds to infinity: |x| >= 65520 for f16, within half a bf16 ulp of FLT_MAX for
  // bf16), or too few free pages throws qkv::Error and leaves the cache unchanged. int8 holds every
  // finite value. With `rotary`, the keys are first rotated (rotary.h) at positions
  // length(seq) + t, after the shapes are checked. k and v may be views of this cache's own pools
  // (k_pool(), v_pool()): they are appended as they were when the call began.
  void append(int64_t seq, TensorView<const float> k, TensorView<const float> v, const RotaryOptions* rotary = nullptr);
  // A new sequence holding the same tokens as `seq`, sharing its pages. Throws for an unknown id.
  int64_t fork(int64_t seq);
  // Returns the sequence's pages to the pool (those no other sequence shares). Throws for an
  // unknown id.
  void free(int64_t seq);

  int64_t length(int64_t seq) const;
  std::span<const int32_t> pages(int64_t seq) const;
  // How many sequences hold pool page `page` (0: free). Throws qkv::Error for a page outside
  // [0, num_pages).
  int32_t page_refcount(int64_t page) const;

  // The sequences `seq_ids` as the decode kernel reads them: copies of their page tables and
  // lengths, borrowing this cache's pool (which never moves while the cache lives). Valid until
  // the cache is moved or destroyed, or one of these sequences is freed; appends to any sequence,
  // forks, and frees of other sequences never write what it reads, so a decode may run on it in
  // one thread while another changes the cache (each call on the cache itself under a lock the
  // threads share; the Python module's is the GIL). Throws for an unknown id.
  PagedKV paged(std::span<const int64_t> seq_ids) const;

  // The stored (dequantized) keys and values of one sequence: k [Hkv, len, D], v [Hkv, len, Dv].
  Tensor<float> keys(int64_t seq) const;
  Tensor<float> values(int64_t seq) const;

  // Raw pools, for inspection: [num_pages, Hkv, page_tokens, D or Dv] of the storage dtype, and
  // the i8 scales [num_pages, Hkv, page_tokens] (null otherwise). Not thread-safe against writers.
  const void* k_pool() const { return k_.get(); }
  const void* v_pool() const { return v_.get(); }
  const float* k_scales() const { return k_scale_.get(); }
  const float* v_scales() const { return v_scale_.get(); }

 private:
  struct Sequence {
    int64_t length = 0;
    std::vector<int32_t> pages;
  };
  struct Free {
    // (A constructor, not a member initializer: unique_ptr needs it default-constructible
    // before KVCache is complete.)
    Free() noexcept : mapped(0) {}
    std::size_t mapped;  // bytes of a direct mapping (large pools), else 0: malloc'd
    void operator()(void* p) const;
  };
  Sequence& find(int64_t seq);
  const Sequence& find(int64_t seq) const;
  Tensor<float> read(int64_t seq, bool values) const;

  KVCacheConfig config_;
  std::unique_ptr<void, Free> k_, v_;
  std::unique_ptr<float, Free> k_scale_, v_scale_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;  // a stack: the next page handed out is free_.back()
  std::unordered_map<int64_t, Sequence> sequences_;
  int64_t next_id_ = 0;
};

// decode_attention (decode.h) over the sequences `seq_ids` of `cache`; q [len(seq_ids), H, N, D].
void decode_attention(TensorView<float> out, TensorView<float> lse, TensorView<const float> q, const KVCache& cache,
                      std::span<const int64_t> seq_ids, const DecodeOptions& options = {});

}  // namespace qkv
