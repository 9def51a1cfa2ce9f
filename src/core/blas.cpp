// sgemm through OpenBLAS, loaded on first use (dlopen) rather than linked. Linked, OpenBLAS
// starts a worker per core from its library constructor, before main(), and each worker
// retries a failed 128 MiB buffer allocation forever: under `ulimit -v 100M` even `qkv --help`
// hung (gdb: the worker in blas_memory_alloc -> malloc(134221824), main() joining it at exit).
// Loaded lazily and told to start no workers, it costs a command that multiplies no matrices
// nothing; a product's blocks run on qkv's own threads instead, as many as the address space
// holds buffers for (qkv/address_space.h).
#include "core/blas.h"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <cblas.h>
#include <fmt/format.h>

#include "core/thread_share.h"
#include "qkv/address_space.h"
#include "qkv/error.h"
#include "qkv/machine_info.h"

#ifndef QKV_OPENBLAS_LIBRARY
#define QKV_OPENBLAS_LIBRARY "libopenblas.so.0"
#endif

namespace qkv::detail {
namespace {

struct OpenBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_set_num_threads) set_num_threads = nullptr;
  decltype(&openblas_get_num_threads) get_num_threads = nullptr;
  bool shared = false;  // loaded by someone else before qkv
};

// An environment variable set to `value` for a scope (not when `value` is null, or when
// `only_if_unset` and the caller set it) and restored after, so the environment other libraries
// read stays the caller's.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value, bool only_if_unset) : name_(name) {
    const char* set = std::getenv(name);
    if (set != nullptr) saved_ = set;
    changed_ = value != nullptr && (set == nullptr || !only_if_unset);
    if (changed_) ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (!changed_) return;
    if (saved_)
      ::setenv(name_, saved_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
  bool changed_ = false;
};

// OpenBLAS 0.3.21 (Debian 12) takes a Zen 4 or Zen 5 for a Haswell and runs its AVX2 kernels;
// its SkylakeX kernels run a layer 1.5-1.6x faster on a Zen 5 (forward and backward of B8 N128
// E768 H12: 108-110 ms against 174 at one thread, 63-69 against 95-102 at two). Any
// CPU with the AVX-512 subsets those kernels use takes them, unless the caller chose a core type.
const char* core_type_for_this_cpu() { return machine_info().avx512 ? "SkylakeX" : nullptr; }

OpenBlas load_openblas() {
  auto open = [](int flags) {
    void* lib = ::dlopen(QKV_OPENBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL | flags);
    return lib != nullptr ? lib : ::dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL | flags);
  };
  // In Python numpy has loaded it already (Debian's libblas.so.3 is OpenBLAS's), with its pool
  // and kernels chosen.
  void* lib = open(RTLD_NOLOAD);
  const bool shared = lib != nullptr;
  if (!shared) {
    // OpenBLAS reads these in its constructor. Its workers (OPENBLAS_NUM_THREADS, else
    // GOTO_NUM_THREADS, OMP_NUM_THREADS, the cores, less one) are never used: qkv's threads
    // make the calls.
    const ScopedEnv one_thread("OPENBLAS_NUM_THREADS", "1", false);
    const ScopedEnv kernels("OPENBLAS_CORETYPE", core_type_for_this_cpu(), true);
    lib = open(0);
  }
  if (lib == nullptr) {
    const char* why = ::dlerror();
    throw Error(fmt::format("cannot load OpenBLAS ({}): {}", QKV_OPENBLAS_LIBRARY, why ? why : "unknown error"));
  }
  OpenBlas b;
  b.shared = shared;
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
// 100M). In an address space below kAddressSpaceReserve, products use sgemm_without_blas instead.
bool address_space_too_small_for_openblas() {
  static const bool small = [] {
    struct rlimit limit {};
    return ::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
           limit.rlim_cur < kAddressSpaceReserve;
  }();
  return small;
}

// Every call of qkv's runs on one OpenBLAS thread: a copy qkv loaded has no workers; a shared
// copy (numpy's) is held at one for the product and its count put back after, under a lock so
// that two products in flight restore the caller's count, not each other's.
class OneBlasThread {
 public:
  explicit OneBlasThread(const OpenBlas& blas) : blas_(blas) {
    if (!blas.shared) return;
    lock_ = std::unique_lock(mutex());
    saved_ = blas.get_num_threads();
    if (saved_ != 1) blas.set_num_threads(1);
  }
  ~OneBlasThread() {
    if (saved_ > 1) blas_.set_num_threads(saved_);
  }
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  const OpenBlas& blas_;
  std::unique_lock<std::mutex> lock_;
  int saved_ = 1;
};

}  // namespace

void sgemm_without_blas(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                        int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // Columns of C per pass. A transposed b's columns are packed as rows, up to about 4 MB of them,
  // so that the inner loop reads every operand with unit stride.
  const int64_t cols_per_pass =
      trans_b ? std::clamp<int64_t>((int64_t{1} << 20) / std::max<int64_t>(k, 1), 1, 256) : 256;
  // A row's sums in runs of kRun products, each run's sum added to the total: a long k then errs
  // like OpenBLAS's blocked sums, not like one chain of k additions.
  constexpr int64_t kRun = 256;
  std::vector<float> acc(static_cast<std::size_t>(std::min(n, cols_per_pass))), run(acc.size());
  std::vector<float> b_rows(trans_b ? acc.size() * static_cast<std::size_t>(k) : 0);
  std::vector<float> a_row(trans_a ? static_cast<std::size_t>(k) : 0);
  for (int64_t c0 = 0; c0 < n; c0 += cols_per_pass) {
    const int64_t cols = std::min(cols_per_pass, n - c0);
    if (trans_b)
      for (int64_t t = 0; t < k; ++t)
        for (int64_t j = 0; j < cols; ++j) b_rows[static_cast<std::size_t>(t * cols + j)] = b[(c0 + j) * ldb + t];
    for (int64_t i = 0; i < m; ++i) {
      const float* ai = a + i * lda;
      if (trans_a) {
        for (int64_t t = 0; t < k; ++t) a_row[static_cast<std::size_t>(t)] = a[t * lda + i];
        ai = a_row.data();
      }
      float* __restrict sum = acc.data();
      float* __restrict part = run.data();
      std::fill(sum, sum + cols, 0.0f);
      for (int64_t t0 = 0; t0 < k; t0 += kRun) {
        std::fill(part, part + cols, 0.0f);
        for (int64_t t = t0; t < std::min(k, t0 + kRun); ++t) {
          const float x = ai[t];
          const float* __restrict bt = trans_b ? b_rows.data() + t * cols : b + t * ldb + c0;
          for (int64_t j = 0; j < cols; ++j) part[j] += x * bt[j];
        }
        for (int64_t j = 0; j < cols; ++j) sum[j] += part[j];
      }
      float* ci = c + i * ldc + c0;
      for (int64_t j = 0; j < cols; ++j) ci[j] = alpha * sum[j] + (beta == 0.0f ? 0.0f : beta * ci[j]);
    }
  }
}

// The grid: blocks of kBlockRows × kBlockCols of C. Each call packs its share of op(b) again
// (k · 256 floats against k · 128 · 256 multiply-adds, under 1%).
constexpr int64_t kBlockRows = 128, kBlockCols = 256;

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads) {
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
    return sgemm_without_blas(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const OpenBlas& blas = openblas();
  const OneBlasThread one(blas);
  const int64_t row_blocks = (m + kBlockRows - 1) / kBlockRows, col_blocks = (n + kBlockCols - 1) / kBlockCols;
  const int64_t blocks = row_blocks * col_blocks;
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  // Each thread calling OpenBLAS takes its own 128 MiB buffer (the limit is a system call: asked
  // only when a product would take more than one thread).
  const int wanted = threads_for_work(threads, blocks, work);
  const int team = wanted > 1 ? blas_threads_within_address_space(wanted) : 1;
  auto block = [&](int64_t i) {
    const int64_t r0 = i / col_blocks * kBlockRows, c0 = i % col_blocks * kBlockCols;
    const int64_t rows = std::min(kBlockRows, m - r0), cols = std::min(kBlockCols, n - c0);
    blas.sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
               static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(k), alpha,
               a + (trans_a ? r0 : r0 * lda), static_cast<int>(lda), b + (trans_b ? c0 * ldb : c0),
               static_cast<int>(ldb), beta, c + r0 * ldc + c0, static_cast<int>(ldc));
  };
  if (team == 1) {
    for (int64_t i = 0; i < blocks; ++i) block(i);
    return;
  }
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t i = 0; i < blocks; ++i) block(i);
}

}  // namespace qkv::detail
