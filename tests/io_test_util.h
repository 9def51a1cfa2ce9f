// Helpers for the file-format tests: a scratch directory removed on destruction, raw file
// reads and writes, and running Debian's Python (which has numpy) as an independent writer.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"
#include "qkv/error.h"

namespace qkv::test {

class TempDir {
 public:
  // `base` "" is the system temporary directory. Tests that rewrite a file hundreds of times
  // pass "/dev/shm": on ext4, truncating and rewriting a file forces a flush to disk each time.
  explicit TempDir(std::string base = "") {
    if (base.empty() || !std::filesystem::is_directory(base)) base = std::filesystem::temp_directory_path().string();
    std::string tmpl = base + "/qkv-io-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  std::string path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Names of every entry in the directory (to prove no temporary file was left behind).
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_;
};

// A version 1.0 .npy header for dtype `descr` and the shape written as a Python tuple, e.g.
// "(524288, 1048576)", padded to 64 bytes as numpy does; for hand-made files with any shape.
inline std::string npy_header(const std::string& descr, const std::string& shape) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string h("\x93NUMPY\x01\x00", 8);
  h += static_cast<char>(dict.size() & 0xff);
  h += static_cast<char>(dict.size() >> 8);
  return h + dict;
}

inline void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `script` with /usr/bin/python3 (argv[1] = dir); returns its exit status.
inline int run_python(const std::string& script, const std::string& dir) {
  std::string file = dir + "/script.py";
  write_raw(file, script);
  std::string cmd = "/usr/bin/python3 " + file + " " + dir;
  return std::system(cmd.c_str());
}

}  // namespace qkv::test
