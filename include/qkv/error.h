// qkv::Error: the one exception type qkv throws for bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace qkv {

// Thrown for every input qkv refuses (bad shapes, unreadable files, non-finite values, sizes
// that would exhaust memory). what() is one line that names the argument or file and the fault.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace qkv
