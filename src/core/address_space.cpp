// blas_threads_within_address_space and threads_within_address_space: how many OpenBLAS workers
// and OpenMP threads RLIMIT_AS leaves room for; the machine's physical memory.
#include "qkv/address_space.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace qkv {

int blas_threads_within_address_space(int wanted) {
  wanted = std::max(wanted, 1);
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return wanted;
  const unsigned long long cap = limit.rlim_cur;
  if (cap <= kAddressSpaceReserve) return 1;
  const unsigned long long workers = (cap - kAddressSpaceReserve) / kBlasWorkerBytes;
  return static_cast<int>(std::min<unsigned long long>(static_cast<unsigned long long>(wanted), workers + 1));
}

namespace {

// A stack size as libgomp parses OMP_STACKSIZE: spaces, a decimal number, spaces, an optional
// unit B, K, M or G (K when none), spaces. nullopt where libgomp ignores the value (it then keeps
// the default stack), including sizes pthread_attr_setstacksize refuses.
std::optional<unsigned long long> libgomp_stacksize(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  while (std::isspace(static_cast<unsigned char>(*text))) ++text;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || errno != 0 || *text == '-') return std::nullopt;
  while (std::isspace(static_cast<unsigned char>(*end))) ++end;
  int shift = 10;
  if (*end != '\0') {
    const char* units = "bkmg";  // bytes, KiB, MiB, GiB
    const char* unit = std::strchr(units, std::tolower(static_cast<unsigned char>(*end)));
    if (unit == nullptr) return std::nullopt;
    shift = 10 * static_cast<int>(unit - units);
    ++end;
    while (std::isspace(static_cast<unsigned char>(*end))) ++end;
    if (*end != '\0') return std::nullopt;
  }
  if (((value << shift) >> shift) != value || (value << shift) < static_cast<unsigned long long>(PTHREAD_STACK_MIN))
    return std::nullopt;
  return value << shift;
}

// glibc's heap for a thread's arena: HEAP_MAX_SIZE, 2 x DEFAULT_MMAP_THRESHOLD_MAX (4 MiB x
// sizeof(long)) = 64 MiB on 64-bit, mapped PROT_NONE, which counts against RLIMIT_AS all the same.
constexpr unsigned long long kMallocArenaBytes = 2ull * 4 * 1024 * 1024 * sizeof(long);

// The process's present size (VmSize), which RLIMIT_AS bounds; 0 if /proc does not say.
unsigned long long address_space_in_use() {
  std::FILE* f = std::fopen("/proc/self/statm", "re");
  if (f == nullptr) return 0;
  unsigned long long pages = 0;
  const bool read = std::fscanf(f, "%llu", &pages) == 1;
  std::fclose(f);
  return read ? pages * static_cast<unsigned long long>(::sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace

// Measured with VmSize around `parallel num_threads(n)` regions whose threads allocate: +73 MiB
// for a thread with its own arena (8 MiB stack, RLIMIT_STACK 8 MiB; 64 MiB heap; TLS and guard),
// +8 MiB for one that allocates nothing or shares an arena (MALLOC_ARENA_MAX=1; glibc makes at
// most 8 per core), +65 MiB with OMP_STACKSIZE=1M. The arena is counted for every thread: when its reservation fails
// glibc falls back to an existing arena, so only the stack is fatal to lack, but an arena that does fit would take the
// room the call's own buffers need.
unsigned long long openmp_thread_bytes() {
  static const unsigned long long bytes = [] {
    std::optional<unsigned long long> stack = libgomp_stacksize("OMP_STACKSIZE");
    if (!stack) stack = libgomp_stacksize("GOMP_STACKSIZE");
    if (!stack) {  // glibc's default: RLIMIT_STACK at start-up, 2 MiB if unlimited
      size_t size = 8ull << 20;
      pthread_attr_t attr;
      if (::pthread_getattr_default_np(&attr) == 0) {
        ::pthread_attr_getstacksize(&attr, &size);
        ::pthread_attr_destroy(&attr);
      }
      stack = size;
    }
    const auto page = static_cast<unsigned long long>(::sysconf(_SC_PAGESIZE));
    return (*stack + page - 1) / page * page + page + kMallocArenaBytes;  // the guard page beside it
  }();
  return bytes;
}

int threads_within_address_space(int wanted) {
  if (wanted <= 1) return 1;
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return wanted;
  const unsigned long long cap = limit.rlim_cur, used = address_space_in_use();
  if (used >= cap) return 1;
  const unsigned long long extra = (cap - used) / openmp_thread_bytes();
  return static_cast<int>(std::min<unsigned long long>(static_cast<unsigned long long>(wanted), extra + 1));
}

// Read once: sysconf(_SC_PHYS_PAGES) is a sysinfo() system call, and every result array of the
// Python module checks its size against it (five calls in a qkv.torch forward and backward).
unsigned long long physical_memory_bytes() {
  static const unsigned long long bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    return pages <= 0 || page <= 0 ? 0ull
                                   : static_cast<unsigned long long>(pages) * static_cast<unsigned long long>(page);
  }();
  return bytes;
}

}  // namespace qkv
