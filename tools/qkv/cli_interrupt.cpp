// StopOnCtrlC: a one-shot SIGINT handler that sets a flag the kernels' InterruptScope polls.
#include "cli_interrupt.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include "qkv/atomic_file.h"

namespace qkv::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;

extern "C" void request_stop(int) { g_stop = 1; }

bool stop_requested(void*) { return g_stop != 0; }

extern "C" void end_by_signal(int sig) {
  if (!end_writes_for_signal(sig)) return;  // raised again once the outputs are in place
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

extern "C" void end_by_bus_error(int sig) {
  (void)end_writes_for_signal(sig);
  constexpr char kMessage[] =
      "qkv: error: a file qkv maps (an input) became shorter while it was read (SIGBUS): another program "
      "truncated or rewrote it\n";
  (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  ::_exit(1);
}

void handle(int sig, void (*handler)(int)) {
  struct sigaction now {};
  ::sigaction(sig, nullptr, &now);
  if (now.sa_handler == SIG_IGN) return;
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  ::sigaction(sig, &sa, nullptr);
}

}  // namespace

void install_signal_handlers() {
  for (int sig : {SIGTERM, SIGHUP, SIGINT, SIGPIPE}) handle(sig, &end_by_signal);
  handle(SIGBUS, &end_by_bus_error);
  ::signal(SIGXFSZ, SIG_IGN);
}

bool open_standard_descriptors() {
  bool stdout_open = true;
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    if (fd == STDOUT_FILENO) stdout_open = false;
    // open() takes the lowest free descriptor: fd itself, the lower ones being open by now.
    const int got = ::open("/dev/null", fd == STDIN_FILENO ? O_RDONLY : O_WRONLY);
    if (got >= 0 && got != fd) {
      ::dup2(got, fd);
      ::close(got);
    }
  }
  return stdout_open;
}

StopOnCtrlC::StopOnCtrlC() : scope_(&stop_requested, nullptr) {
  g_stop = 0;
  ::sigaction(SIGINT, nullptr, &previous_);
  if (previous_.sa_handler == SIG_IGN) return;  // started with SIGINT ignored (nohup, a background job): keep it so
  struct sigaction sa {};
  sa.sa_handler = &request_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;  // the second Ctrl-C finds the default action again
  ::sigaction(SIGINT, &sa, nullptr);
}

StopOnCtrlC::~StopOnCtrlC() { ::sigaction(SIGINT, &previous_, nullptr); }

void StopOnCtrlC::check() const {
  if (g_stop != 0) throw Interrupted();
}

}  // namespace qkv::cli
