// The storage types of a KV cache's pages (kv_cache.h), in core because the decode kernels below
// the cache read them too.
#pragma once

#include <cstdint>
#include <string_view>

namespace qkv {

// How keys and values are stored. i8 holds q = round(x / scale), |q| <= 127, with one fp32 scale
// per (token, head): max|x| / 127 over the token's head vector, rounded down to a float; the value
// it stands for is float(q) * scale. Every value is then within half a step (max|x| / 254) of x,
// before the float rounding of that product. Subnormal tokens keep the bound down to max|x| =
// 127·255·2^-149 (4.5e-41); below it no float scale can, and the next float up is taken: within
// half a step plus 2^-150 (half the smallest subnormal float).
enum class KVDtype { f32, bf16, f16, i8 };

// The canonical name ("f32", "bf16", "f16", "i8"), as parse_kv_dtype accepts it; "unknown" for a
// value outside the enum, so a message can still name it.
const char* kv_dtype_name(KVDtype dtype);
// The names users type, for the CLI and Python alike: the canonical names or numpy's ("float32",
// "bfloat16", "float16", "int8"). Throws qkv::Error "<what> must be 'f32', ..., got '<text>'".
KVDtype parse_kv_dtype(std::string_view text, std::string_view what = "dtype");
// Throws qkv::Error "<who>: dtype = <n> is not a KVDtype (f32, bf16, f16 or i8)" for a value
// outside the enum (an integer cast to KVDtype): the one check of every entry point that takes one.
void require_kv_dtype(KVDtype dtype, std::string_view who);
// Bytes per stored element (the i8 scales not included). Throws as require_kv_dtype.
int64_t kv_dtype_bytes(KVDtype dtype);
// Whether the type keeps one fp32 scale per (token, head) beside its elements (i8).
bool kv_dtype_scaled(KVDtype dtype);

}  // namespace qkv
