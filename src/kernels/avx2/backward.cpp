// The fused attention backward compiled for AVX2 + FMA (called only on CPUs with both).
#include "kernels/avx2/ops.h"
#include "kernels/backward.h"
#include "kernels/backward_tile.h"

namespace qkv::kernels {

void backward_tile_avx2(const BackwardParams& p, const BackwardTask& task, float* scratch) {
  backward_tile<Avx2>(p, task, scratch);
}

}  // namespace qkv::kernels
