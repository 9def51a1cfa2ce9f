// The fused attention backward compiled for AVX-512 (F, BW, DQ, VL). The library itself is built
// for the baseline ISA; backward.cpp calls in here only on CPUs that have these features
// (no avx512bf16: the backward has no bf16 path, and must not run only where the CPU has one).
#include "kernels/avx512/ops.h"
#include "kernels/backward.h"
#include "kernels/backward_tile.h"

namespace qkv::kernels {

void backward_tile_avx512(const BackwardParams& p, const BackwardTask& task, float* scratch) {
  backward_tile<Avx512>(p, task, scratch);
}

}  // namespace qkv::kernels
