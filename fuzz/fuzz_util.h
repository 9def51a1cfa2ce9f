// Helpers shared by the libFuzzer targets. The readers under test take paths and memory-map
// them, so each input is written to a per-process file on tmpfs (/dev/shm) and read back from
// there: the fuzzers exercise exactly the code users run, with no in-memory entry point to keep
// in sync.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace qkv::fuzz {

// A file path unique to this process (and `tag`) on tmpfs, or in $TMPDIR if /dev/shm is absent.
inline std::string scratch_path(const char* tag) {
  const char* dir =
      ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
  return std::string(dir) + "/qkv_fuzz_" + tag + "_" + std::to_string(::getpid());
}

// Replaces the contents of `path` with `size` bytes from `data`; aborts (a fuzzer bug, not a
// finding) if the write fails.
inline void write_scratch(const std::string& path, const uint8_t* data, std::size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    std::perror(path.c_str());
    std::abort();
  }
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) {
      std::perror(path.c_str());
      std::abort();
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

// Removes the scratch files when the fuzzer exits normally.
class ScratchFile {
 public:
  explicit ScratchFile(const char* tag) : path_(scratch_path(tag)) {}
  ~ScratchFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }
  const std::string& write(const uint8_t* data, std::size_t size) {
    write_scratch(path_, data, size);
    return path_;
  }

 private:
  std::string path_;
};

// Fails the run: an invariant the fuzzer checks (not a sanitizer report) was broken.
[[noreturn]] inline void invariant_failed(const char* what) {
  std::fprintf(stderr, "qkv fuzz invariant broken: %s\n", what);
  std::abort();
}

}  // namespace qkv::fuzz
