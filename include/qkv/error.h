// qkv::Error: the one exception type qkv throws for bad input, and FileError, its kind for a file
// that cannot be opened.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace qkv {

// Thrown for every input qkv refuses (bad shapes, unreadable files, non-finite values, sizes
// that would exhaust memory). what() is one line that names the argument or file and the fault.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A file that could not be opened or read (missing, not permitted, a directory): errnum() is the
// system's error number and path() the file as named. A qkv::Error like any other; the Python
// module raises it as the OSError that open() raises (FileNotFoundError for ENOENT).
class FileError : public Error {
 public:
  FileError(const std::string& message, int errnum, std::string path)
      : Error(message), errnum_(errnum), path_(std::move(path)) {}
  int errnum() const { return errnum_; }
  const std::string& path() const { return path_; }

 private:
  int errnum_;
  std::string path_;
};

}  // namespace qkv
