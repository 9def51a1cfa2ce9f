// Cooperative interruption and progress of long calls: attention forward (fused and float64 reference) and
// backward, and attention_weights check for a stop request between tasks (a tile group, or one
// query row of the reference), so a caller such as the Python module can honour Ctrl-C within a
// bounded time. The kernels only read an atomic flag; the caller's poll function (which may
// take a lock, e.g. Python's GIL, to look for a signal) runs on the calling thread at most once
// every `kPollInterval`.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "qkv/error.h"

namespace qkv {

// Thrown by an interruptible call when its InterruptScope's poll asked it to stop. The call's
// outputs are then partly written: callers discard them (the Python module never returns them).
class Interrupted : public Error {
 public:
  Interrupted() : Error("interrupted") {}
};

// While alive, interruptible calls made by this thread call `poll(context)` on this thread at
// most every kPollInterval between tasks; when it returns true they stop early and throw
// Interrupted. Not copyable; scopes nest (the inner one is in force). Only the scope's own
// thread calls `poll`; worker threads only read the flag.
class InterruptScope {
 public:
  using Poll = bool (*)(void* context);
  static constexpr std::chrono::milliseconds kPollInterval{20};

  InterruptScope(Poll poll, void* context);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  // For the kernels: the scope the calling thread is in, or nullptr (read once per call).
  static InterruptScope* current();
  // Between tasks, from any thread of the call: true once a stop was requested. Cheap: one
  // relaxed atomic load, plus (on the scope's own thread, every kPollInterval) the poll.
  bool stop_requested() {
    if (std::this_thread::get_id() == owner_) poll_if_due();
    return stop_.load(std::memory_order_relaxed);
  }
  // Progress of the current call, for a poll that shows it: a call that reports it sets the
  // total before its loop and advances once per task (one relaxed atomic add).
  void set_total(int64_t total) {
    done_.store(0, std::memory_order_relaxed);
    total_.store(total, std::memory_order_relaxed);
  }
  void advance() { done_.fetch_add(1, std::memory_order_relaxed); }
  int64_t done() const { return done_.load(std::memory_order_relaxed); }
  int64_t total() const { return total_.load(std::memory_order_relaxed); }
  // Throws Interrupted if a stop was requested (call after the parallel loop ends).
  void throw_if_stopped() const {
    if (stop_.load(std::memory_order_relaxed)) throw Interrupted();
  }

 private:
  void poll_if_due();
  Poll poll_;
  void* context_;
  std::thread::id owner_;
  std::chrono::steady_clock::time_point next_poll_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> done_{0}, total_{0};
  InterruptScope* outer_;
};

// For loops over tasks: true if `scope` (may be nullptr) asks to stop.
inline bool stop_requested(InterruptScope* scope) { return scope != nullptr && scope->stop_requested(); }
inline void throw_if_stopped(const InterruptScope* scope) {
  if (scope != nullptr) scope->throw_if_stopped();
}

}  // namespace qkv
