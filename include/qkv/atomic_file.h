// Writing files so that a failure never leaves a half-written one.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv {

// Writes `bytes` to the output `path` as qkv/output_file.h decides: a regular file (through
// symlinks) is replaced atomically (temporary file beside it, fsync, rename; a replaced file keeps
// its permissions); a character device, FIFO or /dev/stdout is written directly; anything else is
// refused untouched. On failure throws qkv::Error naming `path` and the reason, removes the
// temporary file and leaves a file target as it was. A temporary file that a killed writer left
// beside the target (.NAME.tmp-PID-..., its PID no longer running) is removed by the next write of
// that target. Thread-safe.
void write_file_atomically(const std::string& path, std::string_view bytes);

// Writes several outputs, each (path, bytes) as write_file_atomically does, so that a failure
// replaces none of the files: every regular file's contents go to its temporary file first, then
// the devices and descriptors get theirs, and only then is each temporary file renamed over its
// target. A failure throws qkv::Error naming that output and removes every temporary file; a
// device or descriptor may then hold part of its bytes, and only a failed rename (which the
// temporary files' directories being writable makes rare) can leave some files replaced. The
// paths must lead to distinct files. Thread-safe.
void write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files);

// For a handler of a fatal signal (SIGTERM, SIGHUP), so that a killed command leaves every output
// whole, old or new, and no temporary file: removes the temporary files that writes in progress in
// this process hold and returns true, after which the handler ends the process. While
// write_files_atomically renames its files into place it returns false instead, having noted
// `sig`: that call raises `sig` again once the last file is in place. Async-signal-safe.
bool end_writes_for_signal(int sig) noexcept;

}  // namespace qkv
