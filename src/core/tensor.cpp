#include "qkv/tensor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/scratch.h"
#include "qkv/out_of_memory.h"

namespace qkv {

float bf16_to_float(bf16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16); }

bf16 float_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fff + ((u >> 16) & 1);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

int64_t checked_numel(std::span<const int64_t> shape, std::size_t element_size, const std::string& what) {
  // Refusing at 2^62 bytes keeps every later `numel * sizeof(T)` and stride product in range.
  constexpr uint64_t kMaxBytes = uint64_t{1} << 62;
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(fmt::format("{}: negative dimension in shape {}", what, shape_string(shape)));
    if (d != 0 && n > kMaxBytes / static_cast<uint64_t>(d))
      throw Error(fmt::format("{}: shape {} is too large to address", what, shape_string(shape)));
    n *= static_cast<uint64_t>(d);
  }
  if (n > kMaxBytes / std::max<std::size_t>(element_size, 1))
    throw Error(fmt::format("{}: shape {} is too large to address", what, shape_string(shape)));
  return static_cast<int64_t>(n);
}

void require_shape(std::span<const int64_t> got, std::span<const int64_t> want, std::string_view name) {
  bool same = got.size() == want.size();  // a plain loop: std::equal calls memcmp, a cost at S1 sizes
  for (std::size_t i = 0; same && i < got.size(); ++i) same = got[i] == want[i];
  if (!same) throw Error(fmt::format("{}: shape {} must be {}", name, shape_string(got), shape_string(want)));
}

std::string shape_string(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

namespace detail {

void AlignedFree::operator()(void* p) const { std::free(p); }

void* aligned_alloc_bytes(std::size_t bytes, const std::string& what) {
  std::size_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (rounded == 0) rounded = kTensorAlignment;
  void* p = std::aligned_alloc(kTensorAlignment, rounded);
  if (p == nullptr) throw OutOfMemory(what, bytes);
  std::memset(p, 0, rounded);
  return p;
}

Scratch::Scratch(int64_t floats, const char* what) {
  const std::size_t bytes = (static_cast<std::size_t>(std::max<int64_t>(floats, 1)) * sizeof(float) + 63) / 64 * 64;
  data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
  if (data_ == nullptr) throw OutOfMemory(what, bytes);
}

}  // namespace detail
}  // namespace qkv
