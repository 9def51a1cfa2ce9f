// Where an output file name leads, decided before anything is written. The rule (what a user of
// `>` in a shell expects, without ever replacing what is not a file of ours):
//   - a regular file, or a name that does not exist yet in an existing directory: written
//     atomically (temporary file beside it, fsync, rename) at the name;
//   - a symlink: followed (up to 40 links) and the rule applied to what it points to, so a link to
//     a file gets the new contents and stays a link; a dangling link creates its target;
//   - a character device or a FIFO (/dev/null, /dev/full, a named pipe): opened and written
//     directly, not atomically, with every write, fsync and close error reported;
//   - /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: written to that open descriptor, so
//     `--out /dev/stdout` streams into a pipe or a redirected file;
//   - anything else (a directory, a socket, a block device, a link into a missing directory,
//     a name whose directory is missing or unwritable): refused, nothing touched.
#pragma once

#include <string>
#include <string_view>

namespace qkv {

enum class OutputKind {
  file,        // replaced atomically at `resolved`
  device,      // a character device or FIFO at `resolved`, opened and written in place
  descriptor,  // an already open descriptor `fd` (/dev/stdout, /dev/fd/N)
};

struct OutputTarget {
  OutputKind kind = OutputKind::file;
  std::string resolved;  // the path written, after following symlinks (file, device)
  bool exists = false;   // file: a file is there now (its permissions are kept)
  int fd = -1;           // descriptor: the descriptor number
};

// Applies the rule above to `path` without writing anything. Throws qkv::Error, one line naming
// `path` and the reason, for every refused target. Thread-safe.
OutputTarget resolve_output(const std::string& path);

// Writes `bytes` to `target` (from resolve_output(path); `path` names it in messages). A file is
// replaced atomically: on failure the old contents stay and no temporary file is left. A device
// or descriptor gets the bytes in order; a failure (ENOSPC on /dev/full, EPIPE, EIO) throws
// qkv::Error naming `path` and the reason, after which some bytes may have been written.
void write_output(const std::string& path, const OutputTarget& target, std::string_view bytes);

}  // namespace qkv
