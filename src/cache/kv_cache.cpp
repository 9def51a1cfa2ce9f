// The paged KV cache: a fixed pool of pages, reference-counted so forks share them, and the
// conversion of new tokens to the storage dtype.
#include "qkv/kv_cache.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "attention/output_checks.h"
#include "core/kv_codec.h"
#include "core/huge_pages.h"
#include "qkv/out_of_memory.h"

namespace qkv {
namespace {

// Pools are allocated by the huge-page rule (core/huge_pages.h): decode streams them whole.
void* allocate(int64_t bytes, const char* what, std::size_t& mapped) {
  void* p = detail::huge_pages_alloc(bytes, mapped);
  if (p == nullptr) throw OutOfMemory(fmt::format("KVCache: the {}", what), static_cast<uint64_t>(bytes));
  return p;
}

// Refuses what the storage dtype cannot hold, naming the tensor and element.
void check_values(TensorView<const float> x, KVDtype dtype, const char* name) {
  for (int64_t t = 0; t < x.dim(0); ++t)
    for (int64_t h = 0; h < x.dim(1); ++h)
      for (int64_t e = 0; e < x.dim(2); ++e) {
        const float value = x(t, h, e);
        // NaN and inf are refused in every dtype: the decode reads a non-finite result as an
        // overflow of finite inputs (decode.cpp), which a stored inf would make false.
        if (!std::isfinite(value))
          throw Error(fmt::format("KVCache::append: {}[{}, {}, {}] = {}: the cache holds finite values only", name, t,
                                  h, e, value));
        if (!detail::kv_storable(dtype, value))
          throw Error(fmt::format("KVCache::append: {}[{}, {}, {}] = {} cannot be stored as {}", name, t, h, e, value,
                                  kv_dtype_name(dtype)));
      }
}

// Bytes a token takes over the cache's heads (kv_cache.h). Exact for any pool the constructor
// allocates: an integer far below 2^53.
double token_bytes(const KVCacheConfig& c) {
  const double scales = kv_dtype_scaled(c.dtype) ? 2.0 * sizeof(float) : 0.0;
  return static_cast<double>(c.Hkv) *
         ((static_cast<double>(c.D) + static_cast<double>(c.Dv)) * static_cast<double>(kv_dtype_bytes(c.dtype)) +
          scales);
}

}  // namespace

double kv_cache_bytes(const KVCacheConfig& c) {
  const double pages = static_cast<double>(c.num_pages);
  return pages * static_cast<double>(c.page_tokens) * token_bytes(c) + pages * 2.0 * sizeof(int32_t);
}

double decode_step_bytes(const KVCacheConfig& c, std::span<const int64_t> seq_lens) {
  if (c.page_tokens <= 0)
    throw Error(fmt::format("decode_step_bytes: page_tokens = {} is not positive", c.page_tokens));
  double tokens = 0, pages = 0;
  for (int64_t len : seq_lens) {
    if (len < 0) throw Error(fmt::format("decode_step_bytes: a sequence of {} tokens", len));
    tokens += static_cast<double>(len);
    pages += static_cast<double>(len / c.page_tokens + (len % c.page_tokens != 0 ? 1 : 0));
  }
  return tokens * token_bytes(c) + pages * sizeof(int32_t) + static_cast<double>(seq_lens.size()) * sizeof(int64_t);
}

void KVCache::Free::operator()(void* p) const { detail::huge_pages_free(p, mapped); }

KVCache::KVCache(const KVCacheConfig& c) : config_(c) {
  require_kv_dtype(c.dtype, "KVCache");
  if (c.num_pages <= 0 || c.page_tokens <= 0 || c.Hkv <= 0 || c.D <= 0 || c.Dv <= 0)
    throw Error(fmt::format("KVCache: num_pages, page_tokens, Hkv, D and Dv must be positive, got {}, {}, {}, {}, {}",
                            c.num_pages, c.page_tokens, c.Hkv, c.D, c.Dv));
  if (c.num_pages > INT32_MAX) throw Error(fmt::format("KVCache: num_pages = {} exceeds 2^31 - 1", c.num_pages));
  const std::array<int64_t, 4> kshape{c.num_pages, c.Hkv, c.page_tokens, c.D};
  const std::array<int64_t, 4> vshape{c.num_pages, c.Hkv, c.page_tokens, c.Dv};
  const int64_t bytes = kv_dtype_bytes(c.dtype);
  k_.reset(allocate(checked_numel(kshape, bytes, "KVCache keys") * bytes, "key pages", k_.get_deleter().mapped));
  v_.reset(allocate(checked_numel(vshape, bytes, "KVCache values") * bytes, "value pages", v_.get_deleter().mapped));
  if (kv_dtype_scaled(c.dtype)) {
    const std::array<int64_t, 3> slots{c.num_pages, c.Hkv, c.page_tokens};
    const int64_t scale_bytes = checked_numel(slots, sizeof(float), "KVCache scales") * 4;
    k_scale_.reset(static_cast<float*>(allocate(scale_bytes, "key scales", k_scale_.get_deleter().mapped)));
    v_scale_.reset(static_cast<float*>(allocate(scale_bytes, "value scales", v_scale_.get_deleter().mapped)));
  }
  refcount_.assign(static_cast<std::size_t>(c.num_pages), 0);
  free_.resize(static_cast<std::size_t>(c.num_pages));
  for (int64_t p = 0; p < c.num_pages; ++p)
    free_[static_cast<std::size_t>(p)] = static_cast<int32_t>(c.num_pages - 1 - p);
}

KVCache::~KVCache() = default;
KVCache::KVCache(KVCache&&) noexcept = default;
KVCache& KVCache::operator=(KVCache&&) noexcept = default;

int64_t KVCache::pool_bytes() const {
  return config_.num_pages * config_.page_tokens * static_cast<int64_t>(token_bytes(config_));
}

KVCache::Sequence& KVCache::find(int64_t seq) { return const_cast<Sequence&>(std::as_const(*this).find(seq)); }

const KVCache::Sequence& KVCache::find(int64_t seq) const {
  const auto it = sequences_.find(seq);
  if (it == sequences_.end()) throw Error(fmt::format("KVCache: unknown sequence id {}", seq));
  return it->second;
}

int64_t KVCache::create() {
  sequences_.emplace(next_id_, Sequence{});
  return next_id_++;
}

int64_t KVCache::length(int64_t seq) const { return find(seq).length; }
std::span<const int32_t> KVCache::pages(int64_t seq) const { return find(seq).pages; }

int32_t KVCache::page_refcount(int64_t page) const {
  if (page < 0 || page >= config_.num_pages)
    throw Error(
        fmt::format("KVCache::page_refcount: page {} is outside the pool of {} pages", page, config_.num_pages));
  return refcount_[static_cast<std::size_t>(page)];
}

void KVCache::append(int64_t seq, TensorView<const float> k, TensorView<const float> v, const RotaryOptions* rotary) {
  Sequence& s = find(seq);
  const KVCacheConfig& c = config_;
  // Shapes first, whatever else was asked: a rotation or a value check of a misshapen k would
  // report on the wrong argument (or read past it).
  if (k.rank() != 3 || k.dim(1) != c.Hkv || k.dim(2) != c.D)
    throw Error(fmt::format("KVCache::append: k has shape {}, expected [T, Hkv = {}, D = {}]", shape_string(k.shape()),
                            c.Hkv, c.D));
  if (v.rank() != 3 || v.dim(0) != k.dim(0) || v.dim(1) != c.Hkv || v.dim(2) != c.Dv)
    throw Error(fmt::format("KVCache::append: v has shape {}, expected [T = {}, Hkv = {}, Dv = {}]",
                            shape_string(v.shape()), k.dim(0), c.Hkv, c.Dv));
  checked_numel(k.shape(), sizeof(float), "KVCache::append: k");
  checked_numel(v.shape(), sizeof(float), "KVCache::append: v");
  detail::require_data(k, "KVCache::append: k");
  detail::require_data(v, "KVCache::append: v");
  const int64_t T = k.dim(0);
  // The pool's token slots number at most 2^62 (the constructor bounded its bytes), so with T below
  // them the page count below cannot overflow, even for a T only a stride-0 view could describe.
  const int64_t slots = c.num_pages * c.page_tokens;
  if (T > slots)
    throw Error(fmt::format("KVCache::append: {} tokens exceed the pool's {} token slots ({} pages of {})", T, slots,
                            c.num_pages, c.page_tokens));
  if (T == 0) return;
  const int64_t have = static_cast<int64_t>(s.pages.size());
  const int64_t need = s.length / c.page_tokens + (s.length % c.page_tokens + T - 1) / c.page_tokens + 1;
  // A partly filled last page that another sequence shares is copied before it is written.
  const bool copy_last = s.length % c.page_tokens != 0 && refcount_[s.pages.back()] > 1;
  const int64_t take = need - have + (copy_last ? 1 : 0);
  if (take > free_pages())
    throw Error(fmt::format("KVCache::append: {} tokens need {} free pages, the pool of {} has {} left", T, take,
                            c.num_pages, free_pages()));
  // An input over the pools (a view of k_pool(), say) would be overwritten while it is read: it is
  // appended as it was when the call began.
  const int64_t rows = c.num_pages * c.Hkv * c.page_tokens, eb_in = kv_dtype_bytes(c.dtype);
  auto pool = [](const void* p, int64_t bytes) {
    const auto* b = static_cast<const std::byte*>(p);
    return p == nullptr ? ByteSpan{} : ByteSpan{b, b + bytes};
  };
  const std::array<ByteSpan, 4> pools{pool(k_.get(), rows * c.D * eb_in), pool(v_.get(), rows * c.Dv * eb_in),
                                      pool(k_scale_.get(), rows * 4), pool(v_scale_.get(), rows * 4)};
  Tensor<float> k_before, v_before;
  auto as_before = [&](TensorView<const float>& x, Tensor<float>& copy) {
    const ByteSpan span = byte_span(x);
    if (std::any_of(pools.begin(), pools.end(), [&](const ByteSpan& p) { return p.overlaps(span); })) {
      copy = to_contiguous<float>(x);
      x = copy.cview();
    }
  };
  as_before(k, k_before);
  as_before(v, v_before);
  check_values(k, c.dtype, "k");
  Tensor<float> rotated;
  if (rotary != nullptr) {
    rotated = to_contiguous<float>(k);
    const std::array<int64_t, 4> shape{1, c.Hkv, T, c.D}, strides{0, c.D, c.Hkv * c.D, 1};
    const std::array<int64_t, 1> offset{s.length};
    apply_rotary(TensorView<float>(rotated.data(), shape, strides), offset, *rotary);
    // A finite key can rotate past what the storage holds: the message says the rotation did it.
    check_values(rotated.cview(), c.dtype, "rotated k");
    k = rotated.cview();
  }
  check_values(v, c.dtype, "v");
  // From here on nothing can fail.
  const int64_t eb = kv_dtype_bytes(c.dtype);
  const int64_t kpage = c.Hkv * c.page_tokens * c.D * eb, vpage = c.Hkv * c.page_tokens * c.Dv * eb;
  const int64_t spage = c.Hkv * c.page_tokens;
  auto* kp = static_cast<char*>(k_.get());
  auto* vp = static_cast<char*>(v_.get());
  auto take_page = [&] {
    const int32_t p = free_.back();
    free_.pop_back();
    refcount_[p] = 1;
    return p;
  };
  if (copy_last) {
    const int32_t old = s.pages.back(), fresh = take_page();
    std::memcpy(kp + fresh * kpage, kp + old * kpage, static_cast<std::size_t>(kpage));
    std::memcpy(vp + fresh * vpage, vp + old * vpage, static_cast<std::size_t>(vpage));
    if (k_scale_) {
      std::memcpy(k_scale_.get() + fresh * spage, k_scale_.get() + old * spage, static_cast<std::size_t>(spage) * 4);
      std::memcpy(v_scale_.get() + fresh * spage, v_scale_.get() + old * spage, static_cast<std::size_t>(spage) * 4);
    }
    --refcount_[old];
    s.pages.back() = fresh;
  }
  while (static_cast<int64_t>(s.pages.size()) < need) s.pages.push_back(take_page());
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = s.length + t, page = s.pages[pos / c.page_tokens], slot = pos % c.page_tokens;
    for (int64_t h = 0; h < c.Hkv; ++h) {
      const int64_t row = (page * c.Hkv + h) * c.page_tokens + slot;
      detail::kv_encode_row(c.dtype, &k(t, h, 0), k.stride(2), c.D, kp + row * c.D * eb,
                            k_scale_ ? k_scale_.get() + row : nullptr);
      detail::kv_encode_row(c.dtype, &v(t, h, 0), v.stride(2), c.Dv, vp + row * c.Dv * eb,
                            v_scale_ ? v_scale_.get() + row : nullptr);
    }
  }
  s.length += T;
}

int64_t KVCache::fork(int64_t seq) {
  Sequence copy = find(seq);
  for (int32_t p : copy.pages) ++refcount_[p];
  sequences_.emplace(next_id_, std::move(copy));
  return next_id_++;
}

void KVCache::free(int64_t seq) {
  Sequence& s = find(seq);
  for (int32_t p : s.pages)
    if (--refcount_[p] == 0) free_.push_back(p);
  sequences_.erase(seq);
}

PagedKV KVCache::paged(std::span<const int64_t> seq_ids) const {
  const KVCacheConfig& c = config_;
  PagedKV kv;
  kv.dtype = c.dtype;
  kv.num_pages = c.num_pages;
  kv.page_tokens = c.page_tokens;
  kv.Hkv = c.Hkv;
  kv.D = c.D;
  kv.Dv = c.Dv;
  kv.k = k_.get();
  kv.v = v_.get();
  kv.k_scale = k_scale_.get();
  kv.v_scale = v_scale_.get();
  for (int64_t id : seq_ids)
    kv.max_blocks = std::max<int64_t>(kv.max_blocks, static_cast<int64_t>(find(id).pages.size()));
  kv.block_table.assign(seq_ids.size() * static_cast<std::size_t>(kv.max_blocks), 0);
  for (std::size_t b = 0; b < seq_ids.size(); ++b) {
    const Sequence& s = find(seq_ids[b]);
    kv.seq_lens.push_back(s.length);
    std::copy(s.pages.begin(), s.pages.end(), kv.block_table.begin() + static_cast<std::ptrdiff_t>(b * kv.max_blocks));
  }
  return kv;
}

Tensor<float> KVCache::read(int64_t seq, bool values) const {
  const Sequence& s = find(seq);
  const KVCacheConfig& c = config_;
  const int64_t dim = values ? c.Dv : c.D, eb = kv_dtype_bytes(c.dtype);
  const auto* pool = static_cast<const char*>(values ? v_.get() : k_.get());
  const float* scales = values ? v_scale_.get() : k_scale_.get();
  Tensor<float> out({c.Hkv, s.length, dim});
  for (int64_t h = 0; h < c.Hkv; ++h)
    for (int64_t t = 0; t < s.length; ++t) {
      const int64_t row = (s.pages[t / c.page_tokens] * c.Hkv + h) * c.page_tokens + t % c.page_tokens;
      for (int64_t e = 0; e < dim; ++e)
        out[(h * s.length + t) * dim + e] =
            detail::kv_decode(c.dtype, pool + row * dim * eb, e, scales ? scales[row] : 0.0f);
    }
  return out;
}

Tensor<float> KVCache::keys(int64_t seq) const { return read(seq, false); }
Tensor<float> KVCache::values(int64_t seq) const { return read(seq, true); }

void decode_attention(TensorView<float> out, TensorView<float> lse, TensorView<const float> q, const KVCache& cache,
                      std::span<const int64_t> seq_ids, const DecodeOptions& options) {
  decode_attention(out, lse, q, cache.paged(seq_ids), options);
}

}  // namespace qkv
