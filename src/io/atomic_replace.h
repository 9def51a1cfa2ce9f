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

// A file's new contents written to a temporary file beside target.resolved (fsync'd, closed, with
// the permissions of the file it replaces) and not yet renamed there: commit() renames it, and
// destruction without commit() removes it, so several outputs can all be written before any
// replaces its file. `path` names the output in messages; every failure throws qkv::Error and
// leaves the target as it was. While it exists the temporary file is listed for
// remove_staged_files().
class StagedFile {
 public:
  StagedFile(const std::string& path, const OutputTarget& target, std::string_view bytes);
  StagedFile(StagedFile&& other) noexcept;
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  StagedFile& operator=(StagedFile&&) = delete;
  ~StagedFile();
  // Renames the temporary file onto the target (refused if the target is no longer a regular
  // file) and makes the rename durable. At most once.
  void commit();

 private:
  std::string path_, target_, tmp_;
  int slot_ = -1;  // the listing's slot, -1 when none
};

// Removes every temporary file a StagedFile of this process holds. Async-signal-safe (unlink
// only): a handler of a fatal signal calls it, so that a killed run leaves no temporary file.
void remove_staged_files() noexcept;

// StagedFile(path, target, bytes).commit(): the atomic replacement of one file.
void replace_file_atomically(const std::string& path, const OutputTarget& target, std::string_view bytes);

}  // namespace qkv::detail
