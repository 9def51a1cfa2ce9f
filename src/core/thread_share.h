// How many threads a call wakes. Starting and joining an OpenMP region costs ~3 µs on a 2-vCPU
// Zen 5 (an empty `parallel for` of 8 items: 2.7-3.1 µs), the time one core takes for ~2^19
// multiply-adds of attention. A thread joins a call only for a share of at least that much work,
// so a short call (a few words, a decode step over a few hundred keys, a small matrix product)
// runs on the calling thread alone; the results are bitwise the same either way.
#pragma once

#include <algorithm>
#include <cstdint>

#include "qkv/attention_options.h"

namespace qkv::detail {

inline constexpr double kMinThreadShare = 1 << 19;

// resolve_num_threads(requested, items), and no more than one thread per kMinThreadShare of
// `work` (multiply-adds, or their equivalent in time); at least 1.
inline int threads_for_work(int requested, int64_t items, double work) {
  const double shares = std::max(1.0, work / kMinThreadShare);
  return resolve_num_threads(requested, shares < static_cast<double>(items) ? static_cast<int64_t>(shares) : items);
}

}  // namespace qkv::detail
