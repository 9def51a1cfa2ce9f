// write_file_atomically: resolve the output (qkv/output_file.h); a regular file gets a temporary
// file beside it, fsync, rename, fsync of the directory.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <random>

#include <fmt/format.h>

#include "io/atomic_replace.h"
#include "io/mapped_file.h"
#include "qkv/atomic_file.h"
#include "qkv/error.h"
#include "qkv/output_file.h"

namespace qkv {
namespace {

std::string directory_of(const std::string& path) {
  std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// A name no other writer (thread or process) is using: pid, a process-wide counter and
// randomness; O_EXCL below turns the unlikely collision into a retry, not a shared file.
std::string temporary_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::string dir = directory_of(path);
  std::size_t slash = path.rfind('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return fmt::format("{}/.{}.tmp-{}-{}-{:08x}", dir, base, static_cast<long>(::getpid()), counter++,
                     static_cast<uint32_t>(rng()));
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("cannot write {}: {}", path, detail::errno_text(errno)));
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

void detail::replace_file_atomically(const std::string& path, const OutputTarget& out, std::string_view bytes) {
  const std::string& target = out.resolved;
  struct stat st {};
  const bool target_exists = out.exists && ::stat(target.c_str(), &st) == 0;

  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = temporary_name(target);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST)
      throw Error(fmt::format("cannot write {}: cannot create a temporary file in {}: {}", path, directory_of(target),
                              detail::errno_text(errno)));
  }
  if (fd < 0) throw Error(fmt::format("cannot write {}: no unused temporary name in {}", path, directory_of(target)));

  try {
    // Replacing a file keeps its permissions, as an in-place write would.
    if (target_exists && S_ISREG(st.st_mode)) (void)::fchmod(fd, st.st_mode & 07777);
    write_all(fd, bytes, path);
    if (::fsync(fd) != 0) throw Error(fmt::format("cannot write {}: fsync: {}", path, detail::errno_text(errno)));
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw Error(fmt::format("cannot write {}: close: {}", path, detail::errno_text(errno)));
    // Checked again just before the rename: a device or directory that appeared since
    // resolve_output is never replaced.
    struct stat now {};
    if (::lstat(target.c_str(), &now) == 0 && !S_ISREG(now.st_mode))
      throw Error(fmt::format("cannot write {}: {} is no longer a regular file", path, target));
    if (::rename(tmp.c_str(), target.c_str()) != 0)
      throw Error(fmt::format("cannot write {}: rename: {}", path, detail::errno_text(errno)));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }

  // The rename is durable only once the directory entry is; failing here loses nothing visible.
  int dir = ::open(directory_of(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_output(path, resolve_output(path), bytes);
}

}  // namespace qkv
