// The first exception the threads of an OpenMP region threw, rethrown after the region. An
// exception must not leave a region (std::terminate), and its type must survive it: a thread's
// failed scratch allocation is a qkv::OutOfMemory (MemoryError in Python), not a bad input.
#pragma once

#include <exception>
#include <mutex>

namespace qkv::detail {

class FirstError {
 public:
  // Runs f(), keeping the exception it throws if none was kept before.
  template <class F>
  void run(F&& f) noexcept {
    try {
      f();
    } catch (...) {
      const std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  // After the region: throws the kept exception, if any.
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
};

}  // namespace qkv::detail
