#include "qkv/mask.h"

#include <array>

#include <fmt/format.h>

namespace qkv {
namespace {

template <class T>
TensorView<T> broadcast_any(TensorView<T> view, int64_t B, int64_t H, int64_t N, int64_t M, const char* what) {
  if (view.rank() < 1 || view.rank() > 4)
    throw Error(fmt::format("{}: rank {} cannot broadcast to [B, H, N, M]", what, view.rank()));
  const TensorView<T> v4 = view.as_rank4();
  const std::array<int64_t, 4> target{B, H, N, M};
  std::array<int64_t, 4> strides{};
  for (int i = 0; i < 4; ++i) {
    if (v4.dim(i) == target[i]) {
      strides[i] = target[i] == 1 ? 0 : v4.stride(i);
    } else if (v4.dim(i) == 1) {
      strides[i] = 0;
    } else {
      throw Error(fmt::format("{}: shape {} does not broadcast to [B, H, N, M] = {}", what, shape_string(view.shape()),
                              shape_string(target)));
    }
  }
  return TensorView<T>(view.data(), target, strides);
}

}  // namespace

TensorView<const float> broadcast_mask(TensorView<const float> view, int64_t B, int64_t H, int64_t N, int64_t M,
                                       const char* what) {
  return broadcast_any(view, B, H, N, M, what);
}

TensorView<const uint8_t> broadcast_mask(TensorView<const uint8_t> view, int64_t B, int64_t H, int64_t N, int64_t M,
                                         const char* what) {
  return broadcast_any(view, B, H, N, M, what);
}

}  // namespace qkv
