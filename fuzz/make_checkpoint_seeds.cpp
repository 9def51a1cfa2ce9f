// Writes the seed corpus of fuzz_checkpoint (valid checkpoints from save_checkpoint) into the
// directory given as argv[1]. Built in the fuzz build; run once, the files are committed.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "qkv/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  qkv::Tensor<float> w({2, 3}), m({3}), empty({0, 4}), scalar(std::vector<int64_t>{});
  for (int64_t i = 0; i < w.numel(); ++i) w[i] = 0.25f * static_cast<float>(i) - 0.5f;
  for (int64_t i = 0; i < m.numel(); ++i) m[i] = 1e-3f * static_cast<float>(i + 1);
  scalar[0] = 7.0f;
  qkv::save_checkpoint(dir + "/weights_and_state", {{"layer.w_q", w.cview()}, {"adam.m.w_q", m.cview()}},
                       {{"step", "12"}, {"rng", "123456789"}, {"config", "{\"heads\": 2}"}});
  qkv::save_checkpoint(dir + "/edge_shapes", {{"empty", empty.cview()}, {"scalar", scalar.cview()}}, {});
  qkv::save_checkpoint(dir + "/metadata_only", {}, {{"step", "0"}});
  for (const char* name : {"weights_and_state", "edge_shapes", "metadata_only"})
    std::remove((dir + "/" + name + ".prev").c_str());
  return 0;
}
