// libFuzzer target: the .npy reader (read_npy_info, load_npy<float/double/uint8_t>). Any input
// must either load or throw qkv::Error; a loaded array must round-trip through npy_bytes.
#include <cstring>

#include "fuzz_util.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace {

template <class T>
bool try_load(const std::string& path, qkv::Tensor<T>* out) {
  try {
    *out = qkv::load_npy<T>(path);
    return true;
  } catch (const qkv::Error&) {
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static qkv::fuzz::ScratchFile input("npy"), copy("npy_copy");
  const std::string& path = input.write(data, size);

  qkv::NpyInfo info;
  try {
    info = qkv::read_npy_info(path);
  } catch (const qkv::Error&) {
  }
  qkv::Tensor<float> f32;
  qkv::Tensor<uint8_t> u8;
  qkv::Tensor<double> f64;
  const bool f32_ok = try_load(path, &f32);
  try_load(path, &u8);
  if (!try_load(path, &f64)) {
    if (f32_ok) qkv::fuzz::invariant_failed("load_npy<float> accepted a file load_npy<double> refused");
    return 0;
  }
  // Every dtype converts to double exactly, so a loaded file is described by its header...
  if (info.shape.size() != static_cast<std::size_t>(f64.rank()) ||
      !std::equal(info.shape.begin(), info.shape.end(), f64.shape().begin()))
    qkv::fuzz::invariant_failed("read_npy_info and load_npy disagree on the shape");
  // ...and survives a write and a read bit for bit.
  const std::string bytes = qkv::npy_bytes<double>(f64.cview());
  qkv::fuzz::write_scratch(copy.path(), reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  const qkv::Tensor<double> again = qkv::load_npy<double>(copy.path());
  if (again.numel() != f64.numel() ||
      std::memcmp(again.data(), f64.data(), static_cast<std::size_t>(f64.numel()) * sizeof(double)) != 0)
    qkv::fuzz::invariant_failed("a loaded .npy does not round-trip through npy_bytes");
  return 0;
}
