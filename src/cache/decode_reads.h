// What a decode call reads, for the checks of what it writes (attention/output_checks.h): q, the
// mask's views and the cache's pools and table. Internal.
#pragma once

#include <vector>

#include "attention/output_checks.h"
#include "qkv/decode.h"

namespace qkv::detail {

// Call after decode_attention's checks of the cache (its sizes are then known not to wrap).
inline std::vector<NamedSpan> decode_read_spans(TensorView<const float> q, const PagedKV& kv, const Mask& mask) {
  std::vector<NamedSpan> read = read_spans(q, TensorView<const float>(), TensorView<const float>(), mask);
  const int64_t slots = kv.num_pages * kv.Hkv * kv.page_tokens, bytes = kv_dtype_bytes(kv.dtype);
  auto span = [](const void* p, int64_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    return ByteSpan{b, b + n};
  };
  read.push_back({"the cache's key pool", span(kv.k, slots * kv.D * bytes)});
  read.push_back({"the cache's value pool", span(kv.v, slots * kv.Dv * bytes)});
  if (kv.k_scale != nullptr) read.push_back({"the cache's key scales", span(kv.k_scale, slots * 4)});
  if (kv.v_scale != nullptr) read.push_back({"the cache's value scales", span(kv.v_scale, slots * 4)});
  read.push_back({"the block table", span(kv.block_table.data(), static_cast<int64_t>(kv.block_table.size() * 4))});
  read.push_back({"seq_lens", span(kv.seq_lens.data(), static_cast<int64_t>(kv.seq_lens.size() * 8))});
  return read;
}

}  // namespace qkv::detail
