// write_file_atomically: resolve the output (qkv/output_file.h); a regular file gets a temporary
// file beside it, fsync, rename, fsync of the directory; temporaries of dead writers are removed.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <iterator>
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

std::string base_of(const std::string& path) {
  std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The prefix of every temporary file of `path`; the writer's pid follows it.
std::string temporary_prefix(const std::string& path) { return fmt::format(".{}.tmp-", base_of(path)); }

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

std::string detail::temporary_name(const std::string& target, long pid, uint64_t serial, uint32_t salt) {
  return fmt::format("{}/{}{}-{}-{:08x}", directory_of(target), temporary_prefix(target), pid, serial, salt);
}

std::string detail::temporary_name(const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return temporary_name(target, static_cast<long>(::getpid()), counter++, static_cast<uint32_t>(rng()));
}

// A live writer's file (kill(pid, 0) succeeds or is not permitted) is never touched, nor a name
// that is not exactly ours (.NAME.tmp-PID-COUNTER-HEX8).
void detail::remove_stale_temporaries(const std::string& target) {
  const std::string dir = directory_of(target);
  const std::string prefix = temporary_prefix(target);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name(e->d_name);
    if (!name.starts_with(prefix)) continue;
    const std::string_view rest = name.substr(prefix.size());
    long pid = 0;
    std::size_t i = 0;
    for (; i < rest.size() && i < 10 && rest[i] >= '0' && rest[i] <= '9'; ++i) pid = pid * 10 + (rest[i] - '0');
    if (i == 0 || i >= rest.size() || rest[i] != '-' || pid <= 0) continue;
    const std::size_t dash = rest.find('-', i + 1);
    if (dash == std::string_view::npos || rest.size() - dash - 1 != 8) continue;
    if (pid == static_cast<long>(::getpid())) continue;  // this process's other writers
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    (void)::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

namespace {

// The temporary files StagedFiles hold, for remove_staged_files() in a signal handler: fixed
// storage, each slot free (0), being filled (1) or listing a path (2). A path too long for a slot,
// or more files at once than slots, goes unlisted: a later write removes it as stale.
struct StagedSlot {
  std::atomic<int> state{0};
  char path[4096];
};
StagedSlot g_staged[64];

int list_staged(const std::string& tmp) {
  if (tmp.size() >= sizeof(StagedSlot::path)) return -1;
  for (int i = 0; i < static_cast<int>(std::size(g_staged)); ++i) {
    int free_slot = 0;
    if (!g_staged[i].state.compare_exchange_strong(free_slot, 1)) continue;
    std::copy(tmp.begin(), tmp.end(), g_staged[i].path);
    g_staged[i].path[tmp.size()] = '\0';
    g_staged[i].state.store(2);
    return i;
  }
  return -1;
}

void unlist_staged(int slot) {
  if (slot >= 0) g_staged[slot].state.store(0);
}

}  // namespace

void detail::remove_staged_files() noexcept {
  for (StagedSlot& slot : g_staged)
    if (slot.state.load() == 2) (void)::unlink(slot.path);
}

detail::StagedFile::StagedFile(const std::string& path, const OutputTarget& out, std::string_view bytes)
    : path_(path), target_(out.resolved) {
  struct stat st {};
  const bool target_exists = out.exists && ::stat(target_.c_str(), &st) == 0;

  detail::remove_stale_temporaries(target_);
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp_ = temporary_name(target_);
    // Listed before it exists: a fatal signal between the file's creation and its listing left it
    // behind. Listed too early, the handler unlinks a name not created yet, or (EEXIST) a file of
    // that very name, which only a dead process with this PID can have left.
    slot_ = list_staged(tmp_);
    fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) break;
    const int error = errno;
    unlist_staged(slot_);
    slot_ = -1;
    if (error != EEXIST)
      throw Error(fmt::format("cannot write {}: cannot create a temporary file in {}: {}", path, directory_of(target_),
                              detail::errno_text(error)));
  }
  if (fd < 0) throw Error(fmt::format("cannot write {}: no unused temporary name in {}", path, directory_of(target_)));

  try {
    // Replacing a file keeps its permissions, as an in-place write would.
    if (target_exists && S_ISREG(st.st_mode)) (void)::fchmod(fd, st.st_mode & 07777);
    write_all(fd, bytes, path);
    if (::fsync(fd) != 0) throw Error(fmt::format("cannot write {}: fsync: {}", path, detail::errno_text(errno)));
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw Error(fmt::format("cannot write {}: close: {}", path, detail::errno_text(errno)));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp_.c_str());
    unlist_staged(slot_);
    throw;
  }
}

detail::StagedFile::StagedFile(StagedFile&& other) noexcept
    : path_(std::move(other.path_)),
      target_(std::move(other.target_)),
      tmp_(std::move(other.tmp_)),
      slot_(other.slot_) {
  other.tmp_.clear();
  other.slot_ = -1;
}

detail::StagedFile::~StagedFile() {
  if (tmp_.empty()) return;
  ::unlink(tmp_.c_str());
  unlist_staged(slot_);
}

void detail::StagedFile::commit() {
  if (tmp_.empty()) throw Error(fmt::format("cannot write {}: already written", path_));
  // Checked again just before the rename: a device or directory that appeared since
  // resolve_output is never replaced.
  struct stat now {};
  if (::lstat(target_.c_str(), &now) == 0 && !S_ISREG(now.st_mode))
    throw Error(fmt::format("cannot write {}: {} is no longer a regular file", path_, target_));
  if (::rename(tmp_.c_str(), target_.c_str()) != 0)
    throw Error(fmt::format("cannot write {}: rename: {}", path_, detail::errno_text(errno)));
  tmp_.clear();
  unlist_staged(slot_);
  slot_ = -1;
  // The rename is durable only once the directory entry is; failing here loses nothing visible.
  int dir = ::open(directory_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

void detail::replace_file_atomically(const std::string& path, const OutputTarget& out, std::string_view bytes) {
  StagedFile(path, out, bytes).commit();
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_output(path, resolve_output(path), bytes);
}

namespace {

// Renames in progress (write_files_atomically's last loop) and a fatal signal they held back.
std::atomic<int> g_renaming{0};
std::atomic<int> g_held_signal{0};

}  // namespace

void write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<OutputTarget> targets;
  for (const auto& [path, bytes] : files) targets.push_back(resolve_output(path));
  std::vector<detail::StagedFile> staged;
  for (std::size_t i = 0; i < files.size(); ++i)
    if (targets[i].kind == OutputKind::file) staged.emplace_back(files[i].first, targets[i], files[i].second);
  for (std::size_t i = 0; i < files.size(); ++i)
    if (targets[i].kind != OutputKind::file) write_output(files[i].first, targets[i], files[i].second);
  g_renaming.fetch_add(1);
  try {
    for (detail::StagedFile& file : staged) file.commit();
  } catch (...) {
    g_renaming.fetch_sub(1);
    throw;
  }
  if (g_renaming.fetch_sub(1) == 1)
    if (const int sig = g_held_signal.exchange(0); sig != 0) ::raise(sig);
}

bool end_writes_for_signal(int sig) noexcept {
  if (g_renaming.load() > 0) {
    g_held_signal.store(sig);
    // Checked again: renames that ended before the store did not see the signal held.
    if (g_renaming.load() > 0) return false;
  }
  detail::remove_staged_files();
  return true;
}

}  // namespace qkv
