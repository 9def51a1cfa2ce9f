// The decode kernel compiled for AVX2 + FMA. fp16 pages widen with vcvtph2ps: F16C is assumed
// with AVX2 (every AVX2 CPU, Intel from Haswell and AMD from Excavator, has it).
#include "kernels/avx2/ops.h"
#include "kernels/decode.h"
#include "kernels/decode_tile.h"

namespace qkv::kernels {

void decode_tile_avx2(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_tile<Avx2Decode>(p, task, ws);
}

void decode_widen_avx2(KVDtype dtype, const void* src, int64_t n, float* dst) {
  widen_row<Avx2Decode>(dtype, static_cast<const char*>(src), n, dst, n);
}

}  // namespace qkv::kernels
