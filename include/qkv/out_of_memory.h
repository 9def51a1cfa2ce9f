// qkv::OutOfMemory: an allocation qkv asked for failed. A qkv::Error (so the CLI prints it as one
// line) that the Python module raises as MemoryError.
#pragma once

#include <cstdint>
#include <string>

#include "qkv/error.h"

namespace qkv {

class OutOfMemory : public Error {
 public:
  // what(): "<what>: cannot allocate <bytes> bytes (out of memory)".
  OutOfMemory(const std::string& what, uint64_t bytes)
      : Error(what + ": cannot allocate " + std::to_string(bytes) + " bytes (out of memory)"), bytes_(bytes) {}
  uint64_t bytes() const { return bytes_; }

 private:
  uint64_t bytes_;
};

}  // namespace qkv
