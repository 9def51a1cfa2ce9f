// What do small pages cost the memory system itself, before any arithmetic? A probe for the
// "paged D2 within 10% of contiguous" target, built by `make bench` as
// build/bench/qkv_paged_stream_probe (AVX-512 only); or by hand:
//   g++ -O3 -march=native -pthread -o /tmp/paged_stream_probe bench/paged_stream_probe.cpp && /tmp/paged_stream_probe
// Two threads read the K and V pools of one f16 layer (8 KV heads, 256-byte rows, 131072 tokens:
// 512 MiB in 2 MiB huge pages) the way cache/decode.cpp's tasks do, and only sum them: tasks of
// 512 keys for one KV head, handed out in runs of 8, each key's K and V rows asked for 8 keys
// ahead through the block table. Layouts, as kv_cache.h stores them ([page][head][token][row]):
//   contiguous: one page per sequence, tasks in (head, chunk) order (decode.cpp's head-major order);
//   paged P, shuffled: pages of P tokens taken from the pool in random order, tasks in (chunk,
//     head) order (the order decode.cpp uses below 256-token pages);
//   paged P, in order: the same pages in pool order (no scatter, only the P-token segments).
// It prints ms per pass (median of 7) and GB/s. docs/benchmarks.md, "Decode".
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr long kHeads = 8, kRow = 256, kTokens = 131072, kChunk = 512, kRun = 8, kAhead = 8;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

char* huge(std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 2 << 20, bytes) != 0) std::abort();
  madvise(p, bytes, MADV_HUGEPAGE);
  std::fill_n(static_cast<char*>(p), bytes, 1);
  return static_cast<char*>(p);
}

struct Layout {
  long page_tokens;
  bool head_major;
  std::vector<int32_t> table;  // the sequence's pages, in key order
};

// Walks head g's rows key by key through the block table, with no division per key (as the
// kernel's prefetch cursor does).
struct Cursor {
  const Layout& l;
  const char* pool;
  long g, block, off;
  Cursor(const Layout& l, const char* pool, long g, long j)
      : l(l), pool(pool), g(g), block(j / l.page_tokens), off(j % l.page_tokens) {}
  const char* row() const { return pool + ((l.table[block] * kHeads + g) * l.page_tokens + off) * kRow; }
  void next() {
    if (++off == l.page_tokens) off = 0, ++block;
  }
};

float sum_pass(const Layout& l, const char* k, const char* v) {
  const long chunks = kTokens / kChunk, tasks = chunks * kHeads;
  std::atomic<long> next{0};
  float part[2] = {0, 0};
  auto worker = [&](int id) {
    __m512 acc = _mm512_setzero_ps();
    for (long first; (first = next.fetch_add(kRun)) < tasks;)
      for (long t = first; t < std::min(first + kRun, tasks); ++t) {
        const long g = l.head_major ? t / chunks : t % kHeads, c = l.head_major ? t % chunks : t / kHeads;
        const long j0 = c * kChunk, j1 = j0 + kChunk;
        Cursor kc(l, k, g, j0), vc(l, v, g, j0), kp(l, k, g, j0), vp(l, v, g, j0);
        for (long a = 0; a < kAhead; ++a) kp.next(), vp.next();
        for (long j = j0; j < j1; ++j) {
          if (j + kAhead < j1) {
            const char* kr = kp.row();
            const char* vr = vp.row();
            for (long b = 0; b < kRow; b += 64) _mm_prefetch(kr + b, _MM_HINT_T0), _mm_prefetch(vr + b, _MM_HINT_T0);
            kp.next(), vp.next();
          }
          const char* kr = kc.row();
          const char* vr = vc.row();
          for (long b = 0; b < kRow; b += 64)
            acc = _mm512_add_ps(acc, _mm512_add_ps(_mm512_load_ps(kr + b), _mm512_load_ps(vr + b)));
          kc.next(), vc.next();
        }
      }
    part[id] = _mm512_reduce_add_ps(acc);
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join(), b.join();
  return part[0] + part[1];
}

}  // namespace

int main() {
  const std::size_t bytes = std::size_t(kTokens) * kHeads * kRow;
  char* k = huge(bytes);
  char* v = huge(bytes);
  std::mt19937 rng(12);
  std::vector<Layout> layouts;
  std::vector<const char*> names;
  layouts.push_back({kTokens, true, {0}});
  names.push_back("contiguous");
  for (long p : {16L, 64L, 256L}) {
    std::vector<int32_t> order(kTokens / p);
    std::iota(order.begin(), order.end(), 0);
    layouts.push_back({p, false, order});
    names.push_back(p == 16 ? "paged 16, in order" : p == 64 ? "paged 64, in order" : "paged 256, in order");
    std::shuffle(order.begin(), order.end(), rng);
    layouts.push_back({p, p >= 256, order});
    names.push_back(p == 16 ? "paged 16, shuffled" : p == 64 ? "paged 64, shuffled" : "paged 256, shuffled");
  }
  float sink = 0;
  std::vector<std::vector<double>> ms(layouts.size());
  for (int round = 0; round < 7; ++round)  // layouts alternate within a round: drift hits all alike
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      const double t0 = now();
      sink += sum_pass(layouts[i], k, v);
      ms[i].push_back((now() - t0) * 1e3);
    }
  std::printf("%-22s %9s %8s %s\n", "layout", "ms/pass", "GB/s", "vs contiguous");
  double base = 0;
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    const double med = ms[i][ms[i].size() / 2];
    if (i == 0) base = med;
    std::printf("%-22s %9.2f %8.2f %+6.1f%%\n", names[i], med, 2.0 * bytes / med / 1e6, (med / base - 1) * 100);
  }
  return sink == 12345.0f;  // keeps the sums alive
}
