// Writing files so that a failure never leaves a half-written one.
#pragma once

#include <string>
#include <string_view>

namespace qkv {

// Writes `bytes` to the output `path` as qkv/output_file.h decides: a regular file (through
// symlinks) is replaced atomically (temporary file beside it, fsync, rename; a replaced file keeps
// its permissions); a character device, FIFO or /dev/stdout is written directly; anything else is
// refused untouched. On failure throws qkv::Error naming `path` and the reason, removes the
// temporary file and leaves a file target as it was. A temporary file that a killed writer left
// beside the target (.NAME.tmp-PID-..., its PID no longer running) is removed by the next write of
// that target. Thread-safe.
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace qkv
