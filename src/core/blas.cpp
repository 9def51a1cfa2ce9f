// sgemm through OpenBLAS, loaded on first use (dlopen) rather than linked. Linked, OpenBLAS
// starts a worker per core from its library constructor, before main(), and each worker
// retries a failed 128 MiB buffer allocation forever: under `ulimit -v 100M` even `qkv --help`
// hung (gdb: the worker in blas_memory_alloc -> malloc(134221824), main() joining it at exit).
// Loaded lazily, a command that multiplies no matrices never starts the pool, and one that does
// sizes it first to what the address space holds (qkv/address_space.h).
#include "core/blas.h"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

#include <cblas.h>
#include <fmt/format.h>

#include "qkv/address_space.h"
#include "qkv/error.h"

#ifndef QKV_OPENBLAS_LIBRARY
#define QKV_OPENBLAS_LIBRARY "libopenblas.so.0"
#endif

namespace qkv::detail {
namespace {

struct OpenBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_set_num_threads) set_num_threads = nullptr;
  decltype(&openblas_get_num_threads) get_num_threads = nullptr;
};

// OpenBLAS reads OPENBLAS_NUM_THREADS (else GOTO_NUM_THREADS, OMP_NUM_THREADS, the cores) when
// it loads: cap it first, unless the user chose it.
void cap_pool_to_address_space() {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  int wanted = cores > 0 ? static_cast<int>(cores) : 1;
  for (const char* name : {"GOTO_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* set = std::getenv(name);
    if (set != nullptr && std::atoi(set) > 0) {
      wanted = std::atoi(set);
      break;
    }
  }
  const int fit = blas_threads_within_address_space(wanted);
  if (fit < wanted) ::setenv("OPENBLAS_NUM_THREADS", std::to_string(fit).c_str(), 1);
}

OpenBlas load_openblas() {
  cap_pool_to_address_space();
  void* lib = ::dlopen(QKV_OPENBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = ::dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    throw Error(fmt::format("cannot load OpenBLAS ({}): {}", QKV_OPENBLAS_LIBRARY, why ? why : "unknown error"));
  }
  OpenBlas b;
  b.sgemm = reinterpret_cast<decltype(b.sgemm)>(::dlsym(lib, "cblas_sgemm"));
  b.set_num_threads = reinterpret_cast<decltype(b.set_num_threads)>(::dlsym(lib, "openblas_set_num_threads"));
  b.get_num_threads = reinterpret_cast<decltype(b.get_num_threads)>(::dlsym(lib, "openblas_get_num_threads"));
  if (b.sgemm == nullptr || b.set_num_threads == nullptr || b.get_num_threads == nullptr)
    throw Error(fmt::format("{} lacks cblas_sgemm or openblas_set_num_threads: is it OpenBLAS?", QKV_OPENBLAS_LIBRARY));
  return b;
}

// Loaded once, thread-safely; a failed load is retried (and reported) on the next call.
const OpenBlas& openblas() {
  static const OpenBlas b = load_openblas();
  return b;
}

// OpenBLAS's calling thread also takes a 128 MiB buffer for a larger product, retrying forever
// when it cannot (gdb: cblas_sgemm -> blas_memory_alloc -> malloc(134221824) under ulimit -v
// 100M). In an address space below kAddressSpaceReserve, products use this loop instead: slower,
// the same within float rounding, and deterministic.
bool address_space_too_small_for_openblas() {
  static const bool small = [] {
    struct rlimit limit {};
    return ::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
           limit.rlim_cur < kAddressSpaceReserve;
  }();
  return small;
}

void sgemm_loop(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t t = 0; t < k; ++t)
        sum += (trans_a ? a[t * lda + i] : a[i * lda + t]) * (trans_b ? b[j * ldb + t] : b[t * ldb + j]);
      c[i * ldc + j] = alpha * sum + (beta == 0.0f ? 0.0f : beta * c[i * ldc + j]);
    }
}

}  // namespace

int blas_num_threads() { return address_space_too_small_for_openblas() ? 1 : openblas().get_num_threads(); }

void set_blas_num_threads(int n) {
  if (!address_space_too_small_for_openblas()) openblas().set_num_threads(blas_threads_within_address_space(n));
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t size : {m, n, k, lda, ldb, ldc})
    if (size < 0 || size > INT_MAX) throw Error(fmt::format("matrix product: size {} is outside [0, 2^31 - 1]", size));
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // cblas would do the same, but some builds reject lda = 0; scale by hand.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  if (address_space_too_small_for_openblas())
    return sgemm_loop(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  openblas().sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                   static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
                   static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

}  // namespace qkv::detail
