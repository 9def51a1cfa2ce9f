// Shape checks of attention_backward's outputs and gradient input, shared by the fp32 kernel and
// the float64 reference. Internal.
#pragma once

#include <array>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "attention/output_checks.h"
#include "qkv/attention.h"

namespace qkv::detail {

// dq [B,H,N,D], dk [B,Hkv,M,D], dv [B,Hkv,M,Dv], dout [B,H,N,Dv], dbias empty or [B,H,N,M].
template <class T>
void check_backward_outputs(const AttentionShape& s, std::span<const int64_t> dq, std::span<const int64_t> dk,
                            std::span<const int64_t> dv, const TensorView<T>& dbias, std::span<const int64_t> dout) {
  require_shape(dout, std::array<int64_t, 4>{s.B, s.H, s.N, s.Dv}, "dout");
  require_shape(dq, std::array<int64_t, 4>{s.B, s.H, s.N, s.D}, "dq");
  require_shape(dk, std::array<int64_t, 4>{s.B, s.Hkv, s.M, s.D}, "dk");
  require_shape(dv, std::array<int64_t, 4>{s.B, s.Hkv, s.M, s.Dv}, "dv");
  if (!dbias.empty()) require_shape(dbias.shape(), std::array<int64_t, 4>{s.B, s.H, s.N, s.M}, "dbias");
}

// Each gradient one place per element (a dk shared by a batch through stride 0 took one batch
// row's gradient, not their sum: sum them from a full buffer), none sharing memory with the
// inputs or with another gradient (require_output).
// `seen`: what the call reads (read_spans and its extras).
template <class T>
void require_gradient_outputs(const TensorView<T>& dq, const TensorView<T>& dk, const TensorView<T>& dv,
                              const TensorView<T>& dbias, std::vector<NamedSpan> seen) {
  for (const auto& [grad, name] : {std::pair{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}, {&dbias, "dbias"}})
    add_output(seen, *grad, name);
}

}  // namespace qkv::detail
