// The decode kernel compiled for AVX-512 (dispatch.cpp: only on CPUs with F, BW, DQ, VL).
// fp16 pages widen with vcvtph2ps (F16C, which every AVX-512 CPU has).
#include "core/half.h"
#include "kernels/avx512/ops.h"
#include "kernels/decode.h"
#include "kernels/decode_tile.h"

namespace qkv::kernels {

void decode_tile_avx512(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_tile<Avx512Decode>(p, task, ws);
}

}  // namespace qkv::kernels
