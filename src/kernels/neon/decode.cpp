// The decode kernel with NEON (AArch64 only). fp16 pages widen with FCVTL, which AArch64's
// Advanced SIMD always has.
#include "kernels/neon/ops.h"
#include "kernels/decode.h"
#include "kernels/decode_tile.h"

namespace qkv::kernels {

void decode_tile_neon(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_tile<NeonDecode>(p, task, ws);
}

void decode_widen_neon(KVDtype dtype, const void* src, int64_t n, float* dst) {
  widen_row<NeonDecode>(dtype, static_cast<const char*>(src), n, dst, n);
}

}  // namespace qkv::kernels
