// Internal: the atomic replacement of a regular file (atomic_file.cpp), used by write_output.
#pragma once

#include <string>
#include <string_view>

#include "qkv/output_file.h"

namespace qkv::detail {

// Writes `bytes` to a temporary file beside target.resolved, fsyncs it and renames it there
// (keeping the permissions of a replaced file); `path` names the output in messages. On failure
// the old file stays and the temporary file is removed.
void replace_file_atomically(const std::string& path, const OutputTarget& target, std::string_view bytes);

}  // namespace qkv::detail
