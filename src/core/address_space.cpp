// blas_threads_within_address_space: how many OpenBLAS workers RLIMIT_AS leaves room for.
#include "qkv/address_space.h"

#include <sys/resource.h>

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

}  // namespace qkv
