// The mask options of `qkv attend` (and its ring form): the command line's spelling of the mask,
// turned into a Mask by the rules every front end shares (qkv/options_parse.h).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "qkv/mask.h"
#include "qkv/tensor.h"

namespace qkv::cli {

// add_mask_options() registers the options; build_mask() loads the mask files and returns a Mask
// whose views point into this struct (keep it alive).
struct MaskArgs {
  std::string causal;                 // "", "top_left" or "bottom_right"
  std::string diagonal = "top_left";  // the window/ALiBi diagonal when not causal
  std::string window;                 // "L,R"
  std::string key_lengths, query_lengths;
  std::string keep_mask_path, bias_path;
  std::string alibi_slopes;
  double softcap = 0.0;

  Tensor<uint8_t> keep;
  Tensor<float> bias;
};
void add_mask_options(CLI::App* app, MaskArgs& args);
// Loads and checks the mask files against [B, H, N, M] (numpy broadcasting); throws qkv::Error
// naming the option and file.
Mask build_mask(MaskArgs& args, int64_t B, int64_t H, int64_t N, int64_t M);

}  // namespace qkv::cli
