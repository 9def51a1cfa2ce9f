// resolve_output: where an output name leads (see qkv/output_file.h), and the direct writes to
// devices, FIFOs and open descriptors. The atomic file replacement is in atomic_file.cpp.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>

#include <fmt/format.h>

#include "io/atomic_replace.h"
#include "io/mapped_file.h"
#include "qkv/error.h"
#include "qkv/output_file.h"

namespace qkv {
namespace {

constexpr int kMaxLinks = 40;  // as the kernel's ELOOP limit

std::string directory_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The descriptor a name stands for, or -1. These are magic links: following them gives
// "pipe:[123]" for a pipe, and reopening a redirected file would write at offset 0.
int standard_descriptor(const std::string& p) {
  if (p == "/dev/stdout") return 1;
  if (p == "/dev/stderr") return 2;
  for (std::string_view prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    if (p.compare(0, prefix.size(), prefix) != 0 || p.size() == prefix.size()) continue;
    int fd = -1;
    const char* begin = p.data() + prefix.size();
    const auto [end, ec] = std::from_chars(begin, p.data() + p.size(), fd);
    if (ec == std::errc() && end == p.data() + p.size() && fd >= 0) return fd;
  }
  return -1;
}

[[noreturn]] void refuse(const std::string& path, const std::string& resolved, const std::string& reason) {
  const std::string via = resolved == path ? "" : fmt::format(" (a link to {})", resolved);
  throw Error(fmt::format("cannot write {}{}: {}", path, via, reason));
}

OutputTarget new_file(const std::string& path, const std::string& p) {
  const std::string dir = directory_of(p);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) refuse(path, p, fmt::format("directory {} does not exist", dir));
    refuse(path, p, fmt::format("directory {}: {}", dir, detail::errno_text(errno)));
  }
  if (!S_ISDIR(st.st_mode)) refuse(path, p, fmt::format("{} is not a directory", dir));
  if (::access(dir.c_str(), W_OK) != 0)
    refuse(path, p, fmt::format("directory {} is not writable ({})", dir, detail::errno_text(errno)));
  return OutputTarget{OutputKind::file, p, false, -1};
}

void write_fd(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {  // a non-blocking pipe: wait until it drains
        pollfd pfd{fd, POLLOUT, 0};
        (void)::poll(&pfd, 1, -1);
        continue;
      }
      throw Error(fmt::format("cannot write {}: {}", path, detail::errno_text(errno)));
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

// fsync on a pipe or most character devices is EINVAL: there is nothing to flush.
void sync_fd(int fd, const std::string& path) {
  if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS && errno != ENOTSUP)
    throw Error(fmt::format("cannot write {}: fsync: {}", path, detail::errno_text(errno)));
}

}  // namespace

OutputTarget resolve_output(const std::string& path) {
  if (path.empty()) throw Error("cannot write a file with an empty name");
  detail::refuse_nul_in_path(path, "write");
  if (path.back() == '/') throw Error(fmt::format("cannot write {}: the name ends in '/'", path));
  std::string p = path;
  for (int links = 0; links <= kMaxLinks; ++links) {
    const int fd = standard_descriptor(p);
    if (fd >= 0) {
      const int flags = ::fcntl(fd, F_GETFL);
      if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY)
        refuse(path, p, fmt::format("descriptor {} is not open for writing", fd));
      return OutputTarget{OutputKind::descriptor, p, true, fd};
    }
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) return new_file(path, p);
      refuse(path, p, detail::errno_text(errno));
    }
    if (S_ISLNK(st.st_mode)) {
      std::string target(4096, '\0');
      const ssize_t n = ::readlink(p.c_str(), target.data(), target.size());
      if (n < 0) refuse(path, p, detail::errno_text(errno));
      target.resize(static_cast<std::size_t>(n));
      p = target.empty() || target[0] == '/' ? target : directory_of(p) + "/" + target;
      if (p.empty() || p.back() == '/') refuse(path, p, "the link names a directory");
      continue;
    }
    if (S_ISREG(st.st_mode)) {
      OutputTarget t = new_file(path, p);
      t.exists = true;
      return t;
    }
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return OutputTarget{OutputKind::device, p, true, -1};
    if (S_ISDIR(st.st_mode)) refuse(path, p, "is a directory");
    const char* what = S_ISSOCK(st.st_mode)  ? "a socket"
                       : S_ISBLK(st.st_mode) ? "a block device"
                                             : "not a regular file";
    refuse(path, p, fmt::format("is {}; outputs go to files, character devices or FIFOs", what));
  }
  refuse(path, p, "more than 40 symbolic links");
}

void write_output(const std::string& path, const OutputTarget& target, std::string_view bytes) {
  if (target.kind == OutputKind::file) return detail::replace_file_atomically(path, target, bytes);
  // Whatever this process printed to stdout before must come first.
  std::fflush(nullptr);
  if (target.kind == OutputKind::descriptor) {
    write_fd(target.fd, bytes, path);
    return;
  }
  // No O_CREAT, no O_TRUNC: the device is there (checked) and is not ours to replace. A FIFO
  // blocks here until a reader opens it, as a shell redirection does.
  const int fd = ::open(target.resolved.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) throw Error(fmt::format("cannot write {}: {}", path, detail::errno_text(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !(S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
    ::close(fd);
    throw Error(fmt::format("cannot write {}: it changed while being opened", path));
  }
  try {
    write_fd(fd, bytes, path);
    sync_fd(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw Error(fmt::format("cannot write {}: close: {}", path, detail::errno_text(errno)));
}

}  // namespace qkv
