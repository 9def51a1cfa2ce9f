// SharedReads: a read or a change of an object that Python threads share (include/qkv's objects
// bound in python/), so that no change lands inside a read made with the GIL released.
#pragma once

namespace qkvpy {

// Objects that Python threads share and that calls read with the GIL released (a KVCache's pool,
// a layer's weights): such a call registers as a reader with the GIL still held, and a call that
// changes the object first waits, with the GIL released, until it has no reader. Readers only
// start with the GIL held, so after the wait none starts before the change (made with the GIL
// held) is done: a change never lands in the middle of a read, and a read never sees half a
// change. A waiting change goes first: a reader that would start meanwhile waits for it (with the
// GIL released), or a thread running reads back to back would keep the change waiting for ever.
// Within one thread (Python code run by an argument's conversion or a signal handler while a
// call's read is held), a second read goes ahead without waiting, and a change of any object raises
// RuntimeError: it could wait for ever for this read, directly or through another thread's. A
// change's wait ends with Ctrl-C.
class SharedReads {
 public:
  // A read of `object` for the guard's lifetime; construct it with the GIL held.
  class Reading {
   public:
    explicit Reading(const void* object);
    ~Reading();
    Reading(const Reading&) = delete;
    Reading& operator=(const Reading&) = delete;

   private:
    const void* object_;
  };

  // A change of `object` for the guard's lifetime: construct it with the GIL held just before
  // changing the object; it returns with the GIL held and no reader, and no reader starts until
  // the guard is destroyed. Throws std::runtime_error if this thread holds a read of any object.
  class Writing {
   public:
    explicit Writing(const void* object);
    ~Writing();
    Writing(const Writing&) = delete;
    Writing& operator=(const Writing&) = delete;

   private:
    const void* object_;
  };
};

}  // namespace qkvpy
