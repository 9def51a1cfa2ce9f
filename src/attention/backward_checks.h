// Shape checks of attention_backward's outputs and gradient input, shared by the fp32 kernel and
// the float64 reference. Internal.
#pragma once

#include <array>
#include <span>

#include <fmt/format.h>

#include "qkv/attention.h"

namespace qkv::detail {

// dq [B,H,N,D], dk [B,Hkv,M,D], dv [B,Hkv,M,Dv], dout [B,H,N,Dv], dbias empty or [B,H,N,M] with
// no stride-0 dimension of size > 1 (each element must be its own gradient).
template <class T>
void check_backward_outputs(const AttentionShape& s, std::span<const int64_t> dq, std::span<const int64_t> dk,
                            std::span<const int64_t> dv, const TensorView<T>& dbias, std::span<const int64_t> dout) {
  require_shape(dout, std::array<int64_t, 4>{s.B, s.H, s.N, s.Dv}, "dout");
  require_shape(dq, std::array<int64_t, 4>{s.B, s.H, s.N, s.D}, "dq");
  require_shape(dk, std::array<int64_t, 4>{s.B, s.Hkv, s.M, s.D}, "dk");
  require_shape(dv, std::array<int64_t, 4>{s.B, s.Hkv, s.M, s.Dv}, "dv");
  if (dbias.empty()) return;
  require_shape(dbias.shape(), std::array<int64_t, 4>{s.B, s.H, s.N, s.M}, "dbias");
  for (int i = 0; i < 4; ++i)
    if (dbias.dim(i) > 1 && dbias.stride(i) == 0)
      throw Error(fmt::format("dbias: dimension {} has stride 0; pass a full [B, H, N, M] buffer and sum it", i));
}

}  // namespace qkv::detail
