// The decode kernel for the baseline ISA: the same chunk algorithm with one-lane vectors.
#include "kernels/kernel_deps.h"
#include "kernels/decode_kernel.h"
#include "core/kv_codec.h"

#include "kernels/simd_scalar.h"

namespace qkv::kernels {
namespace {

struct ScalarDecode : Scalar {
  static float hsum(V x) { return x; }
  static float hmax(V x) { return x; }
  static V reduce_lanes(const V* a) { return a[0]; }
  static V load_f16(const uint16_t* p) { return detail::kv_decode_unscaled(KVDtype::f16, p, 0); }
  static V load_bf16(const uint16_t* p) { return detail::kv_decode_unscaled(KVDtype::bf16, p, 0); }
  static V load_i8(const int8_t* p) { return detail::kv_decode_unscaled(KVDtype::i8, p, 0); }
};

}  // namespace
}  // namespace qkv::kernels

#include "kernels/decode_chunk.h"

namespace qkv::kernels {

void decode_chunk_scalar(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_chunk<ScalarDecode>(p, task, ws);
}

void decode_widen_scalar(KVDtype dtype, const void* src, int64_t n, float* dst) {
  widen_row<ScalarDecode>(dtype, static_cast<const char*>(src), n, dst, n);
}

}  // namespace qkv::kernels
