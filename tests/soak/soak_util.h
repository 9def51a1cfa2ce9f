// Shared by the soak loops (soak.cpp): failure counting and the memory samples.
#pragma once

#include <cstdint>
#include <string>

#include "qkv/kv_dtype.h"

namespace qkv::soak {

// Growth allowed from the warm-up sample to the end: malloc's arenas settle within this, and caches
// that keep their largest size so far (the kernels' per-thread scratch) may still meet a larger
// shape after warm-up; a leak of a page table, a shadow row or a tensor per step passes it within
// the first thousand steps of any loop.
constexpr int64_t kRssSlackKb = 1024;
constexpr int64_t kHeapSlackBytes = 64 * 1024;

extern int failures;
// --leak BYTES: each decode step keeps that much heap for good, so a ctest can show the memory
// checks catch a leak (Soak.catches_a_leak).
extern int64_t leak_per_step;
void fail(const std::string& what);
int64_t rss_kb();
int64_t heap_in_use();
int64_t warm_up_steps(int64_t steps);

// Memory of one loop. The loop calls sample() every step (for the start and the peak), and warm()
// after a tenth of its steps and end() at the end, each at a moment when it holds the same live
// state (no sequence, no batch in flight), so the two samples compare like with like: end() fails
// when resident memory (/proc/self/statm) or heap in use (mallinfo2) grew past the slack.
struct Memory {
  int64_t start_kb = 0, warm_kb = 0, end_kb = 0, peak_kb = 0, warm_heap = 0, end_heap = 0;
  void sample(int64_t step);
  void warm();
  void end(const std::string& loop);
  std::string describe() const;
};

// Runs each loop's code once, small, so lazily created pools (OpenMP threads, dispatch tables) exist
// before the first heap baseline.
void prime();
void soak_decode(KVDtype dtype, int64_t steps, uint64_t seed);
void soak_train(int64_t steps, uint64_t seed);
void soak_io(int64_t rounds, const std::string& dir, uint64_t seed);

}  // namespace qkv::soak
