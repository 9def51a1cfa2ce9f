// The decode kernel compiled for AVX-512 (dispatch.cpp: only on CPUs with F, BW, DQ, VL).
// fp16 pages widen with vcvtph2ps (F16C, which every AVX-512 CPU has).
#include "kernels/avx512/ops.h"
#include "kernels/decode.h"
#include "kernels/decode_tile.h"

namespace qkv::kernels {

void decode_tile_avx512(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_tile<Avx512Decode>(p, task, ws);
}

void decode_widen_avx512(KVDtype dtype, const void* src, int64_t n, float* dst) {
  widen_row<Avx512Decode>(dtype, static_cast<const char*>(src), n, dst, n);
}

}  // namespace qkv::kernels
