// Writing files so that a failure never leaves a half-written one.
#pragma once

#include <string>
#include <string_view>

namespace qkv {

// Writes `bytes` to a temporary file beside `path`, fsyncs it, and renames it over `path` (a
// replaced file keeps its permissions). On failure throws qkv::Error naming `path` and the
// reason, removes the temporary file and leaves `path` as it was. Thread-safe.
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace qkv
