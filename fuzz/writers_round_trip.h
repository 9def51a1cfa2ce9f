// The writers' round trip of fuzz_writers.cpp, shared with FuzzCorpus.WritersRoundTrip (the committed
// corpus replayed in every test build). run() throws Broken for a broken invariant.
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv::fuzz::writers {

// A broken round-trip invariant (what the fuzzer aborts on, and the corpus test reports).
struct Broken {
  const char* what;
};

// Reads the input front to back; past its end every byte is 0, so any input is a complete description.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  void raw(void* out, size_t n) {
    auto* p = static_cast<uint8_t*>(out);
    for (size_t i = 0; i < n; ++i) p[i] = byte();
  }
  std::string string(size_t max_len) {
    std::string s(byte() % (max_len + 1), '\0');
    raw(s.data(), s.size());
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// An array of T with random dims (0-5, so empty arrays too) filled with raw bits, and a view of it
// with its axes permuted (strided unless the order is the identity).
template <class T>
struct Strided {
  qkv::Tensor<T> storage;
  qkv::TensorView<const T> view;

  explicit Strided(Bytes& in) {
    const int rank = in.byte() % 5;
    std::vector<int64_t> dims(static_cast<size_t>(rank));
    for (int64_t& d : dims) d = in.byte() % 6;
    storage = qkv::Tensor<T>(dims);
    if (storage.numel() > 0) in.raw(storage.data(), static_cast<size_t>(storage.numel()) * sizeof(T));
    std::vector<int64_t> strides(dims.size()), order(dims.size());
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; --i) strides[static_cast<size_t>(i)] = s, s *= dims[static_cast<size_t>(i)];
    std::iota(order.begin(), order.end(), 0);
    for (int i = rank - 1; i > 0; --i) std::swap(order[static_cast<size_t>(i)], order[in.byte() % (i + 1)]);
    std::vector<int64_t> vdims, vstrides;
    for (const int64_t a : order)
      vdims.push_back(dims[static_cast<size_t>(a)]), vstrides.push_back(strides[static_cast<size_t>(a)]);
    view = qkv::TensorView<const T>(storage.data(), vdims, vstrides);
  }
};

template <class T>
bool same_bits(const qkv::Tensor<T>& got, qkv::TensorView<const T> want) {
  if (!std::equal(got.shape().begin(), got.shape().end(), want.shape().begin(), want.shape().end())) return false;
  const qkv::Tensor<T> flat = qkv::to_contiguous<T>(want);
  return flat.numel() == 0 || std::memcmp(flat.data(), got.data(), static_cast<size_t>(flat.numel()) * sizeof(T)) == 0;
}

template <class T>
void npy_round_trip(Bytes& in, const std::string& path) {
  const Strided<T> a(in);
  qkv::save_npy<T>(path, a.view);
  if (read_file(path) != qkv::npy_bytes<T>(a.view)) throw Broken{"save_npy wrote other bytes than npy_bytes"};
  if (!same_bits(qkv::load_npy<T>(path), a.view)) throw Broken{"a saved .npy does not load back bit for bit"};
}

inline void safetensors_round_trip(Bytes& in, const std::string& path) {
  const int count = in.byte() % 4;
  std::vector<Strided<float>> arrays;
  std::vector<std::pair<std::string, qkv::TensorView<const float>>> tensors;
  arrays.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    std::string name = in.string(12);
    arrays.emplace_back(in);
    tensors.emplace_back(std::move(name), arrays.back().view);
  }
  std::map<std::string, std::string> metadata;
  for (int i = in.byte() % 3; i > 0; --i) {
    std::string key = in.string(4);
    metadata[key] = in.string(6);
  }
  const std::string before = "the previous file";
  qkv::fuzz::write_scratch(path, reinterpret_cast<const uint8_t*>(before.data()), before.size());
  try {
    qkv::save_safetensors(path, tensors, metadata);
  } catch (const qkv::Error&) {
    if (read_file(path) != before) throw Broken{"a refused save_safetensors changed the file"};
    return;
  }
  std::map<std::string, std::string> got_metadata;
  const qkv::TensorMap got = qkv::load_safetensors(path, &got_metadata);
  if (got.size() != tensors.size()) throw Broken{"safetensors: a tensor was lost or added"};
  for (const auto& [name, view] : tensors) {
    const auto it = got.find(name);
    if (it == got.end()) throw Broken{"safetensors: a name did not round-trip"};
    if (!same_bits(it->second, view)) throw Broken{"safetensors: a tensor did not load back bit for bit"};
  }
  if (got_metadata != metadata) throw Broken{"safetensors: the metadata did not round-trip"};
}

// Runs one input: an .npy of float, double or uint8, or a safetensors file, written to the scratch
// paths given and read back.
inline void run(const uint8_t* data, size_t size, const std::string& npy_path, const std::string& st_path) {
  Bytes in(data, size);
  switch (in.byte() % 4) {
    case 0:
      npy_round_trip<float>(in, npy_path);
      break;
    case 1:
      npy_round_trip<double>(in, npy_path);
      break;
    case 2:
      npy_round_trip<uint8_t>(in, npy_path);
      break;
    default:
      safetensors_round_trip(in, st_path);
  }
}

}  // namespace qkv::fuzz::writers
