#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "qkv/address_space.h"
#include "qkv/error.h"
#include "qkv/out_of_memory.h"

namespace qkv::detail {

std::string errno_text(int errnum) {
  char buf[256];
  // GNU strerror_r returns the message, which may or may not live in buf.
  return std::string(strerror_r(errnum, buf, sizeof buf));
}

void check_fits_in_memory(unsigned __int128 bytes, const std::string& what) {
  const uint64_t physical = physical_memory_bytes();
  if (physical == 0 || bytes <= physical) return;  // unknown: leave it to the allocation
  const uint64_t shown = static_cast<uint64_t>(std::min<unsigned __int128>(bytes, UINT64_MAX));
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  throw Error(
      fmt::format("{}: needs {} bytes ({:.1f} GiB) of memory, more than the {} bytes ({:.1f} GiB) of "
                  "physical memory on this machine",
                  what, shown, static_cast<double>(shown) / kGiB, physical, static_cast<double>(physical) / kGiB));
}

std::string quoted(std::string_view bytes, std::size_t max_bytes) {
  // A cut inside a UTF-8 sequence would leave half a character, which makes the whole message
  // invalid UTF-8: the cut moves back to the sequence's start (continuation bytes are 10xxxxxx).
  std::size_t cut = std::min(bytes.size(), max_bytes);
  for (int back = 0;
       back < 3 && cut < bytes.size() && cut > 0 && (static_cast<unsigned char>(bytes[cut]) & 0xC0) == 0x80; ++back)
    --cut;
  std::string out = "\"";
  for (std::size_t i = 0; i < cut; ++i) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += bytes.size() > max_bytes ? "\"..." : "\"";
  return out;
}

void refuse_nul_in_path(const std::string& path, const char* action) {
  if (path.find('\0') != std::string::npos)
    throw Error(fmt::format("cannot {} {}: the name contains a NUL byte", action, quoted(path, 200)));
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  refuse_nul_in_path(path, "read");
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer before the check below refuses
  // it; on a regular file it changes nothing.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    throw FileError(fmt::format("cannot open {}: {}", path, errno_text(e)), e, path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw FileError(fmt::format("cannot read {}: {}", path, errno_text(e)), e, path);
  }
  if (S_ISDIR(st.st_mode)) {  // open() in Python: IsADirectoryError
    ::close(fd);
    throw FileError(fmt::format("cannot read {}: it is a directory, not a file", path), EISDIR, path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("cannot read {}: not a regular file", path));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  char probe = 0;
  if (size_ == 0 && ::read(fd, &probe, 1) > 0) {  // /proc and /sys files report 0 bytes, mapped or not
    ::close(fd);
    throw Error(
        fmt::format("cannot read {}: it reports a size of 0 bytes but has content (a /proc or /sys file?); "
                    "copy it to a regular file first",
                    path));
  }
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      // No room in the address space (RLIMIT_AS) is what the caller handles as out of memory.
      if (e == ENOMEM) throw OutOfMemory(fmt::format("cannot map {}", path), static_cast<uint64_t>(size_));
      throw Error(fmt::format("cannot map {} ({} bytes): {}", path, size_, errno_text(e)));
    }
    data_ = static_cast<const char*>(p);
  }
  ::close(fd);  // the mapping keeps the file open
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

void MappedFile::advise_sequential() const {
  if (data_ != nullptr) ::madvise(const_cast<char*>(data_), size_, MADV_SEQUENTIAL);
}

void MappedFile::release(std::size_t begin, std::size_t end) const {
  if (data_ == nullptr) return;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // The mapping starts on a page boundary, so offsets round the same way as addresses.
  std::size_t first = (begin + page - 1) / page * page;
  std::size_t last = end >= size_ ? size_ : end / page * page;
  if (last > first) ::madvise(const_cast<char*>(data_) + first, last - first, MADV_DONTNEED);
}

}  // namespace qkv::detail
