// libFuzzer target: the training checkpoint reader (load_checkpoint: safetensors plus a checksum).
// Any input must either load or throw qkv::Error; a loaded checkpoint must survive
// save_checkpoint and a second load unchanged. The seeds are valid checkpoints, so mutations
// reach both the checksum comparison and the safetensors parser beneath it.
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "qkv/checkpoint.h"
#include "qkv/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static qkv::fuzz::ScratchFile input("checkpoint"), copy("checkpoint_copy");
  static const bool once = [] {
    // save_checkpoint keeps the file it replaces as <path>.prev; start from none.
    std::remove((copy.path() + ".prev").c_str());
    return true;
  }();
  (void)once;
  const std::string& path = input.write(data, size);
  qkv::Checkpoint c;
  try {
    c = qkv::load_checkpoint(path);
  } catch (const qkv::Error&) {
    return 0;
  }
  std::vector<std::pair<std::string, qkv::TensorView<const float>>> views;
  for (const auto& [name, t] : c.tensors) views.emplace_back(name, t.cview());
  qkv::Checkpoint again;
  try {
    qkv::save_checkpoint(copy.path(), views, c.metadata);
    again = qkv::load_checkpoint(copy.path());
  } catch (const qkv::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    qkv::fuzz::invariant_failed("a loaded checkpoint could not be saved and reloaded");
  }
  std::remove((copy.path() + ".prev").c_str());
  if (again.metadata != c.metadata || again.tensors.size() != c.tensors.size())
    qkv::fuzz::invariant_failed("checkpoint metadata or names changed in a save/load round trip");
  for (const auto& [name, t] : c.tensors) {
    const auto it = again.tensors.find(name);
    if (it == again.tensors.end() ||
        !std::equal(t.shape().begin(), t.shape().end(), it->second.shape().begin(), it->second.shape().end()) ||
        std::memcmp(t.data(), it->second.data(), static_cast<std::size_t>(t.numel()) * sizeof(float)) != 0)
      qkv::fuzz::invariant_failed("a checkpoint tensor changed in a save/load round trip");
  }
  return 0;
}
