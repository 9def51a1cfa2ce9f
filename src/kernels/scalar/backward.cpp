// The fused attention backward for the baseline ISA: the same task algorithm with one-lane vectors.
#include "kernels/scalar/ops.h"
#include "kernels/backward.h"
#include "kernels/backward_tile.h"

namespace qkv::kernels {

void backward_tile_scalar(const BackwardParams& p, const BackwardTask& task, float* scratch) {
  backward_tile<Scalar>(p, task, scratch);
}

}  // namespace qkv::kernels
