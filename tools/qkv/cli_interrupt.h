// Ctrl-C as a request to stop, for a command that has something to say when it stops (what it
// saved, how to go on).
#pragma once

#include <signal.h>

#include "qkv/interrupt.h"

namespace qkv::cli {

// The exit status of a command stopped by Ctrl-C: 128 + SIGINT, as a shell reports it.
inline constexpr int kInterruptedExit = 130;

// While alive, the first SIGINT only sets a flag: qkv's kernels stop at their next task (an
// InterruptScope on this thread) and check() throws qkv::Interrupted, so the command can stop at
// a point of its choosing and say so. A second SIGINT ends the process at once, as without it.
// One at a time; create and destroy it on the same thread.
// The command's standing signal dispositions, set once at its start:
//   - SIGTERM, SIGHUP, SIGINT and SIGPIPE remove the temporary files of the outputs being written,
//     then end the process as the signal would have, after the renames of a set of outputs
//     finish (end_writes_for_signal); a signal the command started with ignored (nohup) stays
//     ignored;
//   - SIGXFSZ is ignored, so a file-size limit (ulimit -f) fails the write with one line (EFBIG)
//     instead of killing the process beside its temporary file;
//   - SIGBUS, which an input that qkv maps and another program truncates raises when it is read,
//     ends the process with one line and exit 1 instead of a core dump.
void install_signal_handlers();

// A closed standard descriptor would be taken by the first file qkv opens, and what qkv prints
// would land in that file: stdin and stderr, when closed, are opened on /dev/null. Returns false
// when stdout is closed, where every command prints its results.
bool open_standard_descriptors();

class StopOnCtrlC {
 public:
  StopOnCtrlC();
  ~StopOnCtrlC();
  StopOnCtrlC(const StopOnCtrlC&) = delete;
  StopOnCtrlC& operator=(const StopOnCtrlC&) = delete;

  // Throws qkv::Interrupted once Ctrl-C was pressed.
  void check() const;

 private:
  struct sigaction previous_ {};
  InterruptScope scope_;
};

}  // namespace qkv::cli
