// .npy reading (with conversion to float, double or uint8_t) and writing (format 1.0).
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include "core/half.h"
#include "io/mapped_file.h"
#include "io/npy_header.h"
#include "qkv/error.h"
#include "qkv/atomic_file.h"
#include "qkv/npy.h"
#include "qkv/out_of_memory.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the .npy and safetensors readers assume a little-endian host");

struct Half {
  uint16_t bits;
};
struct Bool {
  uint8_t byte;
};

template <class S>
auto number_of(const char* p) {
  S s;
  std::memcpy(&s, p, sizeof s);  // the data may be unaligned in a hostile file
  if constexpr (std::is_same_v<S, Half>)
    return detail::half_to_float(s.bits);
  else if constexpr (std::is_same_v<S, Bool>)
    return static_cast<uint8_t>(s.byte != 0);
  else
    return s;
}

// Converts one element, refusing values the target cannot hold instead of wrapping or
// silently turning a finite double into infinity.
template <class T, class V>
T narrow(V v, int64_t index, const std::string& path) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    bool ok;
    if constexpr (std::is_floating_point_v<V>)
      ok = v >= 0 && v <= 255 && v == std::trunc(v);
    else
      ok = v >= 0 && v <= 255;
    if (!ok)
      throw Error(fmt::format("{}: element {} ({}) is not a uint8 value (an integer from 0 to 255)", path, index, v));
    return static_cast<uint8_t>(v);
  } else if constexpr (std::is_same_v<T, float> && std::is_same_v<V, double>) {
    float f = static_cast<float>(v);
    if (overflows_float32(v)) throw Error(fmt::format("{}: element {} ({}) overflows float32", path, index, v));
    return f;
  } else {
    return static_cast<T>(v);
  }
}

// out: [shape] row-major; the source is read through element strides `src_strides`, which are
// row-major for C order and column-major for Fortran order.
template <class S, class T>
void convert(const char* src, T* out, const std::vector<int64_t>& shape, const std::vector<int64_t>& src_strides,
             const std::string& path) {
  int rank = static_cast<int>(shape.size());
  int64_t dims[4] = {1, 1, 1, 1}, strides[4] = {0, 0, 0, 0};
  for (int i = 0; i < rank; ++i) {
    dims[4 - rank + i] = shape[i];
    strides[4 - rank + i] = src_strides[i];
  }
  int64_t o = 0;
  for (int64_t a = 0; a < dims[0]; ++a)
    for (int64_t b = 0; b < dims[1]; ++b)
      for (int64_t c = 0; c < dims[2]; ++c)
        for (int64_t d = 0; d < dims[3]; ++d, ++o) {
          int64_t s = a * strides[0] + b * strides[1] + c * strides[2] + d * strides[3];
          out[o] = narrow<T>(number_of<S>(src + s * static_cast<int64_t>(sizeof(S))), s, path);
        }
}

template <class F>
void with_source_type(detail::NpyType type, F&& f) {
  using detail::NpyType;
  switch (type) {
    case NpyType::f4:
      return f(float{});
    case NpyType::f8:
      return f(double{});
    case NpyType::f2:
      return f(Half{});
    case NpyType::b1:
      return f(Bool{});
    case NpyType::u1:
      return f(uint8_t{});
    case NpyType::i1:
      return f(int8_t{});
    case NpyType::i4:
      return f(int32_t{});
    case NpyType::i8:
      return f(int64_t{});
  }
}

template <class T>
constexpr const char* descr_of() {
  if constexpr (std::is_same_v<T, float>)
    return "<f4";
  else if constexpr (std::is_same_v<T, double>)
    return "<f8";
  else
    return "|u1";
}

}  // namespace

NpyInfo read_npy_info(const std::string& path) {
  detail::MappedFile file(path);
  return detail::parse_npy_header(file.bytes(), path).info;
}

template <class T>
Tensor<T> load_npy(const std::string& path) {
  detail::MappedFile file(path);
  detail::NpyHeader h = detail::parse_npy_header(file.bytes(), path);
  const std::vector<int64_t>& shape = h.info.shape;
  // data_bytes matches the file; the tensor of T may be up to 8x that (|u1 read as double).
  detail::check_fits_in_memory(static_cast<unsigned __int128>(h.data_bytes / h.item_size) * sizeof(T), path);
  Tensor<T> out(std::span<const int64_t>(shape), path);
  if (out.numel() == 0) return out;
  int rank = static_cast<int>(shape.size());
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (int k = 0; k < rank; ++k) {
    int i = h.info.fortran_order ? k : rank - 1 - k;
    strides[i] = stride;
    stride *= shape[i];
  }
  const char* src = file.data() + h.data_offset;
  with_source_type(h.type, [&](auto s) { convert<decltype(s)>(src, out.data(), shape, strides, path); });
  return out;
}

namespace detail {
std::string npy_header_bytes(std::string_view descr, std::span<const int64_t> dims) {
  std::string shape;
  if (dims.size() == 1)
    shape = fmt::format("({},)", dims[0]);
  else
    shape = fmt::format("({})", fmt::join(dims, ", "));
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape);
  // numpy pads with spaces and a newline so the data starts on a 64-byte boundary.
  std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out;
  out.append("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  return out;
}
}  // namespace detail

template <class T>
std::string npy_bytes(TensorView<const T> t) {
  // A negative dimension wrote a header no reader takes ("shape": (-1, 3)), or failed in reserve.
  const int64_t n = checked_numel(t.shape(), sizeof(T), "npy_bytes: the view");
  if (n > 0 && t.data() == nullptr) throw Error("npy_bytes: the view has no data");
  std::string out = detail::npy_header_bytes(descr_of<T>(), t.shape());
  // A broadcast view of 2^40 elements is a valid view: its bytes are refused by name, not left to
  // std::bad_alloc (or a sanitizer's abort).
  const uint64_t bytes = out.size() + static_cast<uint64_t>(n) * sizeof(T);
  detail::check_fits_in_memory(bytes, "npy_bytes");
  try {
    out.reserve(bytes);
  } catch (const std::bad_alloc&) {
    throw OutOfMemory("npy_bytes", bytes);
  }
  if (t.numel() == 0) return out;
  TensorView<const T> s = t.as_rank4();
  for (int64_t a = 0; a < s.dim(0); ++a)
    for (int64_t b = 0; b < s.dim(1); ++b)
      for (int64_t c = 0; c < s.dim(2); ++c) {
        if (s.stride(3) == 1) {
          out.append(reinterpret_cast<const char*>(&s(a, b, c, 0)), static_cast<std::size_t>(s.dim(3)) * sizeof(T));
          continue;
        }
        for (int64_t d = 0; d < s.dim(3); ++d) out.append(reinterpret_cast<const char*>(&s(a, b, c, d)), sizeof(T));
      }
  return out;
}

template <class T>
void save_npy(const std::string& path, TensorView<const T> t) {
  write_file_atomically(path, npy_bytes(t));
}

template Tensor<float> load_npy<float>(const std::string&);
template Tensor<double> load_npy<double>(const std::string&);
template Tensor<uint8_t> load_npy<uint8_t>(const std::string&);
template std::string npy_bytes<float>(TensorView<const float>);
template std::string npy_bytes<double>(TensorView<const double>);
template std::string npy_bytes<uint8_t>(TensorView<const uint8_t>);
template void save_npy<float>(const std::string&, TensorView<const float>);
template void save_npy<double>(const std::string&, TensorView<const double>);
template void save_npy<uint8_t>(const std::string&, TensorView<const uint8_t>);

}  // namespace qkv
