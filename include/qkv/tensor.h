// Tensors: TensorView (non-owning pointer + shape + element strides) and Tensor (owning,
// 64-byte aligned, contiguous row-major). Rank is at most 4.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "qkv/error.h"

namespace qkv {

inline constexpr int kMaxRank = 4;
inline constexpr std::size_t kTensorAlignment = 64;

// bfloat16 as stored bits: the top 16 bits of an IEEE float32.
struct bf16 {
  uint16_t bits = 0;
};
float bf16_to_float(bf16 x);
// Rounds to nearest even; NaN stays NaN.
bf16 float_to_bf16(float x);

// Multiplies a shape's dimensions, throwing qkv::Error (naming `what`) on a negative dimension or
// when the element count times `element_size` would pass 2^62 bytes; an element_size of 0 bounds
// the count alone (2^62 elements).
int64_t checked_numel(std::span<const int64_t> shape, std::size_t element_size, const std::string& what);

// Describes a shape as "[2, 3, 4]" for messages.
std::string shape_string(std::span<const int64_t> shape);

// The one shape-equality check of qkv's API: throws qkv::Error "<name>: shape [..] must be [..]"
// unless `got` equals `want`. Cheap (no allocation unless it throws).
void require_shape(std::span<const int64_t> got, std::span<const int64_t> want, std::string_view name);

// A non-owning view: pointer, shape and strides in elements (a stride may be 0 to broadcast).
// Cheap to copy; the caller keeps the memory alive. Thread-compatible, like a pointer.
template <class T>
class TensorView {
 public:
  TensorView() = default;
  // A contiguous row-major view of `shape`.
  TensorView(T* data, std::span<const int64_t> shape) : data_(data), rank_(static_cast<int>(shape.size())) {
    check_rank();
    // Unsigned, so a shape past int64 (refused later by checked_numel) wraps instead of overflowing.
    uint64_t stride = 1;
    for (int i = rank_ - 1; i >= 0; --i) {
      shape_[i] = shape[i];
      strides_[i] = static_cast<int64_t>(stride);
      stride *= static_cast<uint64_t>(shape[i]);
    }
  }
  TensorView(T* data, std::initializer_list<int64_t> shape)
      : TensorView(data, std::span<const int64_t>(shape.begin(), shape.size())) {}
  TensorView(T* data, std::span<const int64_t> shape, std::span<const int64_t> strides)
      : data_(data), rank_(static_cast<int>(shape.size())) {
    check_rank();
    if (strides.size() != shape.size()) throw Error("TensorView: shape and strides differ in rank");
    for (int i = 0; i < rank_; ++i) {
      shape_[i] = shape[i];
      strides_[i] = strides[i];
    }
  }
  // A view of T converts to a view of const T.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  TensorView(const TensorView<U>& other) : data_(other.data()), rank_(other.rank()) {
    for (int i = 0; i < rank_; ++i) {
      shape_[i] = other.dim(i);
      strides_[i] = other.stride(i);
    }
  }

  T* data() const { return data_; }
  int rank() const { return rank_; }
  bool empty() const { return data_ == nullptr; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t stride(int i) const { return strides_[i]; }
  std::span<const int64_t> shape() const { return {shape_.data(), static_cast<std::size_t>(rank_)}; }
  std::span<const int64_t> strides() const { return {strides_.data(), static_cast<std::size_t>(rank_)}; }
  // Saturates at INT64_MAX for a shape past int64 (whose size checked_numel refuses).
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i)
      if (__builtin_mul_overflow(n, shape_[i], &n)) n = std::numeric_limits<int64_t>::max();
    return n;
  }
  bool is_contiguous() const {
    int64_t stride = 1;
    for (int i = rank_ - 1; i >= 0; --i) {
      if (shape_[i] != 1 && strides_[i] != stride) return false;
      stride *= shape_[i];
    }
    return true;
  }

  T& operator()(int64_t i) const { return data_[i * strides_[0]]; }
  T& operator()(int64_t i, int64_t j) const { return data_[i * strides_[0] + j * strides_[1]]; }
  T& operator()(int64_t i, int64_t j, int64_t k) const {
    return data_[i * strides_[0] + j * strides_[1] + k * strides_[2]];
  }
  T& operator()(int64_t i, int64_t j, int64_t k, int64_t l) const {
    return data_[i * strides_[0] + j * strides_[1] + k * strides_[2] + l * strides_[3]];
  }

  // The same memory seen as rank 4 by prepending dimensions of size 1 (stride 0).
  TensorView as_rank4() const {
    if (rank_ > 4) throw Error("as_rank4: rank above 4");
    std::array<int64_t, 4> shape{1, 1, 1, 1}, strides{0, 0, 0, 0};
    for (int i = 0; i < rank_; ++i) {
      shape[4 - rank_ + i] = shape_[i];
      strides[4 - rank_ + i] = strides_[i];
    }
    return TensorView(data_, shape, strides);
  }
  // Swaps two dimensions without moving data.
  TensorView transposed(int a, int b) const {
    TensorView t = *this;
    std::swap(t.shape_[a], t.shape_[b]);
    std::swap(t.strides_[a], t.strides_[b]);
    return t;
  }

 private:
  void check_rank() const {
    if (rank_ > kMaxRank) throw Error("TensorView: rank above 4");
  }
  T* data_ = nullptr;
  int rank_ = 0;
  std::array<int64_t, kMaxRank> shape_{};
  std::array<int64_t, kMaxRank> strides_{};
};

namespace detail {
struct AlignedFree {
  void operator()(void* p) const;
};
void* aligned_alloc_bytes(std::size_t bytes, const std::string& what);
}  // namespace detail

// An owning, contiguous, row-major tensor whose data is 64-byte aligned and zero-initialized.
// Allocation failure or an overflowing shape throws qkv::Error. Movable, not copyable (use clone()).
template <class T>
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::span<const int64_t> shape, const std::string& what = "tensor")
      : rank_(static_cast<int>(shape.size())) {
    if (rank_ > kMaxRank) throw Error(what + ": rank above 4");
    numel_ = checked_numel(shape, sizeof(T), what);
    for (int i = 0; i < rank_; ++i) shape_[i] = shape[i];
    data_.reset(static_cast<T*>(detail::aligned_alloc_bytes(static_cast<std::size_t>(numel_) * sizeof(T), what)));
  }
  Tensor(std::initializer_list<int64_t> shape, const std::string& what = "tensor")
      : Tensor(std::span<const int64_t>(shape.begin(), shape.size()), what) {}
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  Tensor clone() const {
    if (!data_) return Tensor();  // the empty tensor (rank 0, no data), not a scalar
    Tensor t(shape());
    for (int64_t i = 0; i < numel_; ++i) t.data()[i] = data()[i];
    return t;
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  int rank() const { return rank_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return numel_; }
  std::span<const int64_t> shape() const { return {shape_.data(), static_cast<std::size_t>(rank_)}; }
  TensorView<T> view() { return TensorView<T>(data(), shape()); }
  TensorView<const T> view() const { return TensorView<const T>(data(), shape()); }
  TensorView<const T> cview() const { return view(); }
  T& operator[](int64_t i) { return data_.get()[i]; }
  const T& operator[](int64_t i) const { return data_.get()[i]; }

 private:
  std::unique_ptr<T, detail::AlignedFree> data_;
  int rank_ = 0;
  int64_t numel_ = 0;
  std::array<int64_t, kMaxRank> shape_{};
};

// Calls f(element, index) for every element of `view` in row-major order, where index is the
// element's position in view.as_rank4(): the one walk over a view of any rank and strides.
template <class T, class F>
void for_each_element(const TensorView<T>& view, F&& f) {
  const TensorView<T> v = view.as_rank4();
  std::array<int64_t, 4> i{};
  for (i[0] = 0; i[0] < v.dim(0); ++i[0])
    for (i[1] = 0; i[1] < v.dim(1); ++i[1])
      for (i[2] = 0; i[2] < v.dim(2); ++i[2])
        for (i[3] = 0; i[3] < v.dim(3); ++i[3]) f(v(i[0], i[1], i[2], i[3]), std::as_const(i));
}

// Converts one element; bf16 widens exactly to float first.
template <class To, class From>
To element_cast(From x) {
  if constexpr (std::is_same_v<std::remove_cv_t<From>, bf16>)
    return static_cast<To>(bf16_to_float(x));
  else
    return static_cast<To>(x);
}

// True when a finite double becomes infinite as a float: every reader of float64 data refuses
// such a value rather than store an infinity the data never held.
inline bool overflows_float32(double v) { return std::isfinite(v) && !std::isfinite(static_cast<float>(v)); }

// An element that is not finite: its index in the view's own shape (rank entries) and its value.
struct NonFinite {
  std::vector<int64_t> index;
  double value;
};

// The first element of `view` in row-major order that is NaN or infinite, or nothing. With
// `allow_neg_inf`, -inf passes: in an additive bias it means "never attend".
template <class T>
std::optional<NonFinite> find_non_finite(const TensorView<T>& view, bool allow_neg_inf = false) {
  const TensorView<T> v = view.as_rank4();
  for (int64_t a = 0; a < v.dim(0); ++a)
    for (int64_t b = 0; b < v.dim(1); ++b)
      for (int64_t c = 0; c < v.dim(2); ++c)
        for (int64_t d = 0; d < v.dim(3); ++d) {
          const double x = element_cast<double>(v(a, b, c, d));
          if (std::isfinite(x) || (allow_neg_inf && x == -std::numeric_limits<double>::infinity())) continue;
          const std::array<int64_t, 4> at{a, b, c, d};
          return NonFinite{std::vector<int64_t>(at.end() - view.rank(), at.end()), x};
        }
  return std::nullopt;
}

// The bytes a view's elements span, [begin, end); both null for a view with no elements.
struct ByteSpan {
  const std::byte* begin = nullptr;
  const std::byte* end = nullptr;
  bool overlaps(const ByteSpan& o) const { return begin < o.end && o.begin < end; }
};

template <class T>
ByteSpan byte_span(const TensorView<T>& view) {
  if (view.numel() == 0 || view.data() == nullptr) return {};
  const T *first = view.data(), *last = view.data();
  for (int i = 0; i < view.rank(); ++i) (view.stride(i) < 0 ? first : last) += (view.dim(i) - 1) * view.stride(i);
  return {reinterpret_cast<const std::byte*>(first), reinterpret_cast<const std::byte*>(last + 1)};
}

// Whether two elements of `view` may be one place in memory: a stride-0 dimension of size > 1, or
// strides that interleave. Dimensions sorted by |stride| must each step past all the smaller ones
// (every dense, padded or permuted layout does); a layout that does not is counted as overlapping.
template <class T>
bool may_self_overlap(const TensorView<T>& view) {
  if (view.numel() == 0) return false;  // no element to share (a dimension of 0 makes strides 0)
  // (|stride|, size) of the dimensions of size > 1, then placeholders that sort after them.
  std::array<std::pair<int64_t, int64_t>, kMaxRank> dims;
  dims.fill({std::numeric_limits<int64_t>::max(), 1});
  int n = 0;
  for (int i = 0; i < view.rank() && i < kMaxRank; ++i)
    if (view.dim(i) > 1) dims[n++] = {view.stride(i) < 0 ? -view.stride(i) : view.stride(i), view.dim(i)};
  std::sort(dims.begin(), dims.end());
  int64_t reach = 1;  // elements spanned by the dimensions so far, plus one
  for (int i = 0; i < n; ++i) {
    if (dims[i].first < reach) return true;
    int64_t step = 0;
    if (__builtin_mul_overflow(dims[i].first, dims[i].second - 1, &step) || __builtin_add_overflow(step, reach, &reach))
      return i + 1 < n;  // past any address: a larger stride would have to step past it
  }
  return false;
}

// Copies any view (any strides) into a new contiguous tensor of element type To.
template <class To, class From>
Tensor<To> to_contiguous(TensorView<From> src) {
  Tensor<To> out(src.shape());
  int64_t o = 0;
  for_each_element(src, [&](From& x, const auto&) { out[o++] = element_cast<To>(x); });
  return out;
}

}  // namespace qkv
