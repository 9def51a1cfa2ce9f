// The decode kernel for the baseline ISA: the same chunk algorithm with one-lane vectors.
#include "kernels/scalar/ops.h"
#include "kernels/decode.h"
#include "kernels/decode_tile.h"

namespace qkv::kernels {

void decode_tile_scalar(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_tile<ScalarDecode>(p, task, ws);
}

void decode_widen_scalar(KVDtype dtype, const void* src, int64_t n, float* dst) {
  widen_row<ScalarDecode>(dtype, static_cast<const char*>(src), n, dst, n);
}

}  // namespace qkv::kernels
