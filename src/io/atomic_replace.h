// Internal: the atomic replacement of a regular file (atomic_file.cpp), used by write_output and
// the checkpoint's previous copy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "qkv/output_file.h"

namespace qkv::detail {

// The temporary file name of writer process `pid` for `target`: .NAME.tmp-PID-SERIAL-SALT (SALT 8
// hex digits) beside it. The one form remove_stale_temporaries recognizes.
std::string temporary_name(const std::string& target, long pid, uint64_t serial, uint32_t salt);

// A name of that form that no other writer, thread or process, is using (this pid, a process-wide
// serial and randomness); open it with O_EXCL (a collision is then a retry).
std::string temporary_name(const std::string& target);

// A process killed between creating a temporary file and renaming it (kill -9, a power cut)
// leaves it behind: removes the temporary files of `target` whose writer process no longer
// exists. Best effort: errors are ignored.
void remove_stale_temporaries(const std::string& target);

// Writes `bytes` to a temporary file beside target.resolved, fsyncs it and renames it there
// (keeping the permissions of a replaced file); `path` names the output in messages. On failure
// the old file stays and the temporary file is removed.
void replace_file_atomically(const std::string& path, const OutputTarget& target, std::string_view bytes);

}  // namespace qkv::detail
