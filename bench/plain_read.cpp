// An outside check of qkv's read-bandwidth probe (qkv/machine_info.h), sharing none of its code: T
// threads each sum an array of their own (512 MiB over all, 2 MiB huge pages asked for) as 4
// streams at once with a plain loop the compiler vectorizes, all released together; the rate of
// each pass is the bytes read by all over the time until the last finishes. Median of 11 passes,
// at 1 and 2 threads.
// Prints one JSON line: {"threads_1": bytes/s, "threads_2": bytes/s}. `make bench` prints the
// probe's figure beside it.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t kBytes = std::size_t{512} << 20;

float* huge(std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, std::size_t{2} << 20, bytes) != 0) std::abort();
  madvise(p, bytes, MADV_HUGEPAGE);
  std::fill_n(static_cast<float*>(p), bytes / sizeof(float), 1.0f);
  return static_cast<float*>(p);
}

// n a multiple of 64: four quarters read side by side, one accumulator vector each. Built for the
// widest vectors the CPU has (chosen at load time), so the check runs on every x86-64 machine.
__attribute__((noinline, target_clones("avx512f", "avx2", "default"))) float sum(const float* p, std::size_t n) {
  float acc[4][16] = {};
  const std::size_t q = n / 4;
  for (std::size_t i = 0; i < q; i += 16)
    for (int s = 0; s < 4; ++s)
      for (int j = 0; j < 16; ++j) acc[s][j] += p[s * q + i + j];
  float total = 0;
  for (auto& a : acc)
    for (float x : a) total += x;
  return total;
}

// The threads live for every pass and wait at a start line, so a pass times the reads alone, not
// the creation of threads: from the moment they are released until the last one finishes. The
// calling thread reads array 0 itself, so no thread waits on a core a reader needs.
double rate(int threads) {
  const std::size_t n = kBytes / sizeof(float) / threads / 64 * 64;
  std::vector<float*> arrays(threads);
  for (float*& a : arrays) a = huge(n * sizeof(float));
  constexpr int kPasses = 12;  // the first pass warms up, uncounted
  std::atomic<int> go{-1}, done{0};
  std::vector<float> totals(threads);
  std::vector<std::thread> team;
  for (int t = 1; t < threads; ++t)
    team.emplace_back([&, t] {
      for (int pass = 0; pass < kPasses; ++pass) {
        while (go.load(std::memory_order_acquire) != pass) {
        }
        totals[t] += sum(arrays[t], n);
        done.fetch_add(1, std::memory_order_acq_rel);
      }
    });
  std::vector<double> rates;
  for (int pass = 0; pass < kPasses; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    go.store(pass, std::memory_order_release);
    totals[0] += sum(arrays[0], n);
    done.fetch_add(1, std::memory_order_acq_rel);
    while (done.load(std::memory_order_acquire) != threads * (pass + 1)) {
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (pass > 0) rates.push_back(static_cast<double>(n * sizeof(float) * threads) / seconds);
  }
  for (std::thread& member : team) member.join();
  volatile float sink = 0;
  for (float x : totals) sink = sink + x;
  for (float* a : arrays) std::free(a);
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

int main() {
  const double one = rate(1), two = rate(2);
  std::printf("{\"threads_1\": %.6g, \"threads_2\": %.6g}\n", one, two);
  return 0;
}
