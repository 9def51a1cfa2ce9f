// StopOnCtrlC: a one-shot SIGINT handler that sets a flag the kernels' InterruptScope polls.
#include "cli_interrupt.h"

#include <csignal>

namespace qkv::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;

extern "C" void request_stop(int) { g_stop = 1; }

bool stop_requested(void*) { return g_stop != 0; }

}  // namespace

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
