// An outside check of qkv's read-bandwidth probe (qkv/machine_info.h) whose read loop shares none
// of the probe's code: T threads each sum an array of their own (as many bytes over all as the
// probe reads, memory_probe_bytes(), allocated by the same rule) as 1, 2, 4 or 8 streams at once
// with a plain loop the compiler vectorizes, all released together; the rate of each pass is the
// bytes read by all over the time until the last finishes. 11 rounds (after one to warm up), each
// one pass of every stream count; the median per count, and the best of those, at 1 and 2
// threads. The probe reports the best median of the same four counts, so the two figures are the
// same statistic (a best of four noisy medians sits above any one of them when the counts are
// close).
//
// Each round also calls the probe itself (one pass of each count, its best), before or after the
// round's own passes in turn: the two are compared round by round, seconds apart, since the
// memory of a shared host drifts by a quarter between the minutes of two separate runs.
//
// Prints one JSON line: {"threads_1": best bytes/s, "by_streams_1": {"1": median, ...},
// "probe_1": the probe's median, "probe_vs_plain_pct_1": median over rounds of probe / own - 1,
// in %, and the same for 2 threads}. `make bench` prints the comparison.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/huge_pages.h"
#include "qkv/machine_info.h"

namespace {

constexpr std::array<int, 4> kStreams = {1, 2, 4, 8};

// n a multiple of 64·S: S parts read side by side, 64 floats of each per step into four
// accumulator vectors of 16 (the same four whatever S, so no S leaves the adds setting the pace).
template <int S>
[[gnu::always_inline]] inline float sum_parts(const float* p, std::size_t n) {
  float acc[4][16] = {};
  const std::size_t q = n / S;
  for (std::size_t i = 0; i < q; i += 64)
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < 4; ++h)
        for (int j = 0; j < 16; ++j) acc[h][j] += p[s * q + i + 16 * h + j];
  float total = 0;
  for (auto& a : acc)
    for (float x : a) total += x;
  return total;
}

// Built for the widest vectors the CPU has (chosen at load time), so the check runs on every x86-64
// machine; the template above is inlined into each clone and compiled for its instruction set.
__attribute__((noinline, target_clones("avx512f", "avx2", "default"))) float sum(const float* p, std::size_t n,
                                                                                 int streams) {
  switch (streams) {
    case 1:
      return sum_parts<1>(p, n);
    case 2:
      return sum_parts<2>(p, n);
    case 4:
      return sum_parts<4>(p, n);
    default:
      return sum_parts<8>(p, n);
  }
}

struct Rates {
  std::array<double, kStreams.size()> medians{};  // own, per stream count
  double probe = 0;                               // the probe's median over rounds
  double probe_vs_plain_pct = 0;                  // median over rounds of probe / own best - 1
};

// The threads live for every round and wait at a start line: spinning for 2 ms, so a pass that
// follows another starts on every thread at once (a sleeping thread took long enough to wake to
// cost a pass of 2 threads 3-6%), then asleep, so they leave the cores to the probe. A pass is
// timed from their release until the last one finishes. The calling thread reads array 0 itself,
// so no thread waits on a core a reader needs.
Rates rates(int threads) {
  // As many bytes as the probe reads: on this class of host a 1 GiB buffer read 7-20% slower than
  // a 256 MiB one in the same minute, so a different size would confound the comparison.
  const std::size_t n = static_cast<std::size_t>(qkv::memory_probe_bytes()) / sizeof(float) / threads / 512 * 512;
  // Allocated by qkv's rule for streamed buffers (core/huge_pages.h), as the probe's and the
  // caches' are, so the two reads see the same pages.
  std::vector<std::unique_ptr<qkv::detail::HugePageFloats>> arrays;
  for (int t = 0; t < threads; ++t) {
    arrays.push_back(std::make_unique<qkv::detail::HugePageFloats>(static_cast<int64_t>(n), "plain read"));
    std::fill_n(arrays.back()->data(), n, 1.0f);
  }
  constexpr int kRounds = 12;  // the first round warms up, uncounted
  constexpr int kPasses = kRounds * static_cast<int>(kStreams.size());
  std::atomic<int> go{-1}, done{0};
  // Every pass must sum every element once: with all of them 1, each lane's 2^21-odd ones and the
  // lanes' total are exact in float, so a pass that skipped or repeated a part shows as a wrong sum.
  std::atomic<int> wrong{0};
  auto read = [&](int t, int pass) {
    if (sum(arrays[t]->data(), n, kStreams[pass % kStreams.size()]) != static_cast<float>(n)) wrong.fetch_add(1);
  };
  std::vector<std::thread> team;
  for (int t = 1; t < threads; ++t)
    team.emplace_back([&, t] {
      for (int pass = 0; pass < kPasses; ++pass) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
        for (int seen = go.load(std::memory_order_acquire); seen != pass; seen = go.load(std::memory_order_acquire))
          if (std::chrono::steady_clock::now() > until) go.wait(seen, std::memory_order_acquire);
        read(t, pass);
        done.fetch_add(1, std::memory_order_acq_rel);
      }
    });
  std::array<std::vector<double>, kStreams.size()> by_count;
  std::vector<double> probes, ratios;
  for (int round = 0; round < kRounds; ++round) {
    double probe = 0, own = 0;
    for (int turn = 0; turn < 2; ++turn) {
      if ((turn == 0) == (round % 2 == 0)) {
        probe = qkv::probe_read_bandwidth(threads, qkv::memory_probe_bytes(), 1).best;
        continue;
      }
      for (int pass = round * static_cast<int>(kStreams.size()); pass < (round + 1) * static_cast<int>(kStreams.size());
           ++pass) {
        const auto start = std::chrono::steady_clock::now();
        go.store(pass, std::memory_order_release);
        go.notify_all();
        read(0, pass);
        done.fetch_add(1, std::memory_order_acq_rel);
        while (done.load(std::memory_order_acquire) != threads * (pass + 1)) {
        }
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double rate = static_cast<double>(n * sizeof(float) * threads) / seconds;
        own = std::max(own, rate);
        if (round > 0) by_count[pass % kStreams.size()].push_back(rate);
      }
    }
    if (round > 0) {
      probes.push_back(probe);
      ratios.push_back(probe / own);
    }
  }
  for (std::thread& member : team) member.join();
  if (wrong.load() != 0) {
    std::fprintf(stderr, "qkv_plain_read: %d passes summed a wrong total\n", wrong.load());
    std::exit(1);
  }
  Rates r;
  for (std::size_t i = 0; i < kStreams.size(); ++i) r.medians[i] = qkv::median(by_count[i]);
  r.probe = qkv::median(probes);
  r.probe_vs_plain_pct = 100.0 * (qkv::median(ratios) - 1.0);
  return r;
}

std::string json(int threads, const Rates& r) {
  std::string by;
  for (std::size_t i = 0; i < kStreams.size(); ++i) {
    char item[64];
    std::snprintf(item, sizeof item, "%s\"%d\": %.6g", i ? ", " : "", kStreams[i], r.medians[i]);
    by += item;
  }
  char head[96], tail[128];
  std::snprintf(head, sizeof head, "\"threads_%d\": %.6g, \"by_streams_%d\": {", threads,
                *std::max_element(r.medians.begin(), r.medians.end()), threads);
  std::snprintf(tail, sizeof tail, "}, \"probe_%d\": %.6g, \"probe_vs_plain_pct_%d\": %.4g", threads, r.probe, threads,
                r.probe_vs_plain_pct);
  return head + by + tail;
}

}  // namespace

int main() {
  const auto one = rates(1), two = rates(2);
  std::printf("{%s, %s}\n", json(1, one).c_str(), json(2, two).c_str());
  return 0;
}
