// The decode kernel with NEON (AArch64 only). fp16 pages widen with FCVTL, which AArch64's
// Advanced SIMD always has.
#include "core/half.h"
#include "kernels/neon/ops.h"
#include "kernels/decode.h"
#include "kernels/decode_tile.h"

namespace qkv::kernels {

void decode_tile_neon(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_tile<NeonDecode>(p, task, ws);
}

}  // namespace qkv::kernels
