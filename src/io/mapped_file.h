// Internal: a read-only memory map of a whole file, used by the .npy, .safetensors and
// embedding readers so a large file is never copied into a second buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qkv::detail {

// Maps `path` read-only. Throws qkv::FileError naming the path for a missing or unreadable file
// or a directory; qkv::Error for another non-regular file, and for a file that reports 0 bytes but
// reads some (procfs, sysfs: there is no size to map). An empty file maps to an empty view.
// Movable, not copyable.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;
  ~MappedFile();

  const char* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::string_view bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

  // Hints that [begin, end) will be read once, front to back.
  void advise_sequential() const;
  // Drops the pages wholly inside [begin, end) from this process's resident set (they stay in
  // the page cache), so a pass over a large file does not hold the whole file resident.
  void release(std::size_t begin, std::size_t end) const;

 private:
  std::string path_;
  const char* data_ = nullptr;
  std::size_t size_ = 0;
};

// Throws qkv::Error "<what>: needs N bytes of memory, more than the machine's M bytes of physical
// memory" if `bytes` exceeds physical RAM (sysconf _SC_PHYS_PAGES). Readers call it after a
// declared size passed the file-size checks and before allocating from it, so a (sparse) file
// consistent with its header fails with that line, not std::bad_alloc or the OOM killer.
void check_fits_in_memory(unsigned __int128 bytes, const std::string& what);

// Throws qkv::Error "cannot <action> <path>: the name contains a NUL byte" for such a path: the
// system calls would read it only up to the NUL, i.e. act on another file. The readers and the
// output rule call it first.
void refuse_nul_in_path(const std::string& path, const char* action);

// strerror for `errnum` (thread-safe).
std::string errno_text(int errnum);

// A short printable rendering of untrusted bytes for messages: quoted, control bytes escaped,
// cut at `max_bytes` (or up to 3 bytes before, so as not to split a UTF-8 sequence).
std::string quoted(std::string_view bytes, std::size_t max_bytes = 40);

}  // namespace qkv::detail
