#include "shared_reads.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include <pybind11/pybind11.h>

#include "gil_release.h"

namespace py = pybind11;

namespace qkvpy {

namespace {

// Never destroyed: a thread may still finish a read while the interpreter exits.
std::mutex& readers_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::condition_variable& readers_changed() {
  static auto* cv = new std::condition_variable;
  return *cv;
}
// Per shared object: reads running, and changes waiting or running.
struct Users {
  int readers = 0, writers = 0;
};
std::unordered_map<const void*, Users>& users() {
  static auto* c = new std::unordered_map<const void*, Users>;
  return *c;
}

// Waits (the GIL released, the lock dropped before the GIL is taken again: a reader takes them in
// that order) until `ready` holds under the lock; returns holding the GIL and the lock.
template <class F>
std::unique_lock<std::mutex> wait_until(F ready) {
  std::unique_lock lock(readers_mutex());
  while (!ready()) {
    lock.unlock();
    {
      GilRelease release;
      std::unique_lock wait(readers_mutex());
      // Ctrl-C ends the wait: a change can wait for a read of seconds.
      while (!readers_changed().wait_for(wait, std::chrono::milliseconds(20), ready)) {
        if (interpreter_exiting()) continue;  // no GIL to take (gil_release.h)
        wait.unlock();
        const py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        wait.lock();
      }
    }
    lock.lock();
  }
  return lock;
}

// The reads this thread holds, by object.
std::unordered_map<const void*, int>& own_reads() {
  thread_local std::unordered_map<const void*, int> reads;
  return reads;
}

void leave(const void* object, int Users::*role) {
  {
    const std::lock_guard lock(readers_mutex());
    auto it = users().find(object);
    if (--(it->second.*role) == 0 && it->second.readers == 0 && it->second.writers == 0) users().erase(it);
  }
  readers_changed().notify_all();
}

}  // namespace

SharedReads::Reading::Reading(const void* object) : object_(object) {
  // A read nested in this thread's own read (an argument's conversion calling another read) does
  // not wait for a waiting change: the change waits for the outer read, which waits for this one.
  if (own_reads().contains(object_)) {
    const std::lock_guard lock(readers_mutex());
    ++users()[object_].readers;
  } else {
    auto lock = wait_until([&] {
      auto it = users().find(object_);
      return it == users().end() || it->second.writers == 0;
    });
    ++users()[object_].readers;
  }
  ++own_reads()[object_];
}

SharedReads::Reading::~Reading() {
  auto it = own_reads().find(object_);
  if (--it->second == 0) own_reads().erase(it);
  leave(object_, &Users::readers);
}

SharedReads::Writing::Writing(const void* object) : object_(object) {
  // Whatever the object: a change that waits for another thread's read of it may wait for ever
  // when that thread waits, in the same way, for this thread's read (two caches, each freed from
  // inside a read of the other).
  if (!own_reads().empty())
    throw std::runtime_error(
        "a call in this thread is reading a qkv object (Python code run inside it, by an argument's conversion "
        "or a signal handler, tries to change one); the change could wait for ever for that call, so it is "
        "refused");
  {
    const std::lock_guard lock(readers_mutex());
    ++users()[object_].writers;  // from now on no reader starts
  }
  try {
    auto lock = wait_until([&] { return users()[object_].readers == 0; });
  } catch (...) {
    leave(object_, &Users::writers);
    throw;
  }
}

SharedReads::Writing::~Writing() { leave(object_, &Users::writers); }

}  // namespace qkvpy
