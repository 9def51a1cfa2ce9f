// Training checkpoints: named fp32 tensors (weights, optimizer state) and string metadata (step,
// RNG state, config) in one .safetensors file carrying a checksum, written atomically. The
// checkpoint it replaces is kept as <path>.prev, so a bad file never leaves you without a good one.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "qkv/tensor_map.h"

namespace qkv {

struct Checkpoint {
  TensorMap tensors;
  std::map<std::string, std::string> metadata;  // without the checksum entry
};

// The metadata key holding the checksum: FNV-1a 64 (16 hex digits) over every tensor's name,
// shape and float32 bytes and every other metadata entry, in name order.
inline constexpr const char* kChecksumKey = "qkv.checksum";

// Writes a checkpoint to `path` atomically (temporary file, fsync, rename). An existing file at
// `path` is first kept as `path`.prev (a hard link, or a copy where links are unsupported).
// Tensor names must be unique; any strides. Throws qkv::Error if anything cannot be written, in
// which case `path` is unchanged.
void save_checkpoint(const std::string& path,
                     const std::vector<std::pair<std::string, TensorView<const float>>>& tensors,
                     const std::map<std::string, std::string>& metadata);

// Throws qkv::Error for a `path` that save_checkpoint would refuse whatever it writes: a target
// the output rule refuses (qkv/output_file.h), or a directory or other non-file where the previous
// checkpoint is kept (<path>.prev, beside the file a link points to). Writes nothing; a training
// loop calls it before its first step rather than failing at its first checkpoint.
void check_checkpoint_path(const std::string& path);

// Reads a checkpoint and verifies its checksum. Throws qkv::Error naming `path` for a missing,
// unreadable, truncated or corrupted file (and says whether `path`.prev exists).
Checkpoint load_checkpoint(const std::string& path);

}  // namespace qkv
