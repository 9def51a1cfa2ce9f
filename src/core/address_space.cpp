// blas_threads_within_address_space: how many OpenBLAS workers RLIMIT_AS leaves room for; the
// machine's physical memory.
#include "qkv/address_space.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

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
