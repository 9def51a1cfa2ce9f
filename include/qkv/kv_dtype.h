// The storage types of a KV cache's pages (kv_cache.h), in core because the decode kernels below
// the cache read them too.
#pragma once

#include <cstdint>

namespace qkv {

// How keys and values are stored. i8 holds round(x / scale) with one fp32 scale per (token, head),
// scale = max|x| / 127 over the token's head vector; the value it stands for is float(q) * scale.
enum class KVDtype { f32, bf16, f16, i8 };

const char* kv_dtype_name(KVDtype dtype);
// Bytes per stored element (the i8 scales not included).
int64_t kv_dtype_bytes(KVDtype dtype);

}  // namespace qkv
