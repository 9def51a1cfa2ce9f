// The decode kernel for the baseline ISA: the same chunk algorithm with one-lane vectors.
#include "core/half.h"
#include "kernels/scalar/ops.h"
#include "kernels/decode.h"
#include "kernels/decode_tile.h"

namespace qkv::kernels {

void decode_tile_scalar(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_tile<ScalarDecode>(p, task, ws);
}

}  // namespace qkv::kernels
