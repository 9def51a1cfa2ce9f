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
