// The first exception the threads of an OpenMP region threw, rethrown after the region. An
// exception must not leave a region (std::terminate), and its type must survive it: a thread's
// failed scratch allocation is a qkv::OutOfMemory (MemoryError in Python), not a bad input.
#pragma once

#include <atomic>
#include <exception>
#include <mutex>

namespace qkv::detail {

class FirstError {
 public:
  // Runs f(), keeping the exception it throws if none was kept before; false if it threw.
  template <class F>
  bool run(F&& f) noexcept {
    try {
      f();
      return true;
    } catch (...) {
      const std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
      return false;
    }
  }
  // Whether any thread's f() threw (for threads to stop taking work).
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  // After the region: throws the kept exception, if any.
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
};

}  // namespace qkv::detail
