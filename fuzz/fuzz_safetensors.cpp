// libFuzzer target: the .safetensors reader. Any input must either load or throw qkv::Error; a
// loaded file must survive save_safetensors and a second load unchanged (names, shapes, bits,
// metadata).
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "qkv/error.h"
#include "qkv/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static qkv::fuzz::ScratchFile input("safetensors"), copy("safetensors_copy");
  const std::string& path = input.write(data, size);
  qkv::TensorMap tensors;
  std::map<std::string, std::string> metadata;
  try {
    tensors = qkv::load_safetensors(path, &metadata);
  } catch (const qkv::Error&) {
    return 0;
  }
  std::vector<std::pair<std::string, qkv::TensorView<const float>>> views;
  for (const auto& [name, t] : tensors) views.emplace_back(name, t.cview());
  std::map<std::string, std::string> metadata2;
  qkv::TensorMap again;
  try {
    qkv::save_safetensors(copy.path(), views, metadata);
    again = qkv::load_safetensors(copy.path(), &metadata2);
  } catch (const qkv::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    qkv::fuzz::invariant_failed("a loaded .safetensors file could not be saved and reloaded");
  }
  if (metadata2 != metadata || again.size() != tensors.size())
    qkv::fuzz::invariant_failed("metadata or tensor names changed in a save/load round trip");
  for (const auto& [name, t] : tensors) {
    const auto it = again.find(name);
    if (it == again.end()) qkv::fuzz::invariant_failed("a tensor name was lost in a save/load round trip");
    const qkv::Tensor<float>& u = it->second;
    if (!std::equal(t.shape().begin(), t.shape().end(), u.shape().begin(), u.shape().end()) ||
        std::memcmp(t.data(), u.data(), static_cast<std::size_t>(t.numel()) * sizeof(float)) != 0)
      qkv::fuzz::invariant_failed("a tensor changed in a save/load round trip");
  }
  return 0;
}
