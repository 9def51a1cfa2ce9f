// InterruptScope: the calling thread's stop request, polled on that thread at a bounded rate.
#include "qkv/interrupt.h"

namespace qkv {
namespace {

thread_local InterruptScope* g_current = nullptr;

}  // namespace

InterruptScope::InterruptScope(Poll poll, void* context)
    : poll_(poll),
      context_(context),
      owner_(std::this_thread::get_id()),
      next_poll_(std::chrono::steady_clock::now() + kPollInterval),
      outer_(g_current) {
  g_current = this;
}

InterruptScope::~InterruptScope() { g_current = outer_; }

InterruptScope* InterruptScope::current() { return g_current; }

void InterruptScope::poll_if_due() {
  if (poll_ == nullptr || stop_.load(std::memory_order_relaxed)) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_poll_) return;
  next_poll_ = now + kPollInterval;
  if (poll_(context_)) stop_.store(true, std::memory_order_relaxed);
}

}  // namespace qkv
