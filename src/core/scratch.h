// Floats a call always writes before it reads them (the ring's K/V and gradient buffers, the
// backward's partial sums). Unlike a Tensor they are not zeroed: zeroing faults in and writes
// every page, and a buffer or a part of one that a call never touches then costs no memory
// traffic at all.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace qkv::detail {

class Scratch {
 public:
  // Room for `floats` floats (at least one), 64-byte aligned; throws qkv::OutOfMemory naming `what`.
  Scratch(int64_t floats, const char* what);
  float* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
};

}  // namespace qkv::detail
