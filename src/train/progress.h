// The progress report shared by the training loops (train_lookup, train_masked_word): loss and
// accuracy averaged over the last steps, throughput and the time left. Internal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>

#include "qkv/train_progress.h"

namespace qkv::detail {

// `recent`: (loss, accuracy) of the last steps; steps first..step were done in `elapsed` seconds
// and processed `tokens` tokens.
inline TrainProgress window_progress(int64_t step, int64_t first, int64_t steps,
                                     const std::deque<std::pair<double, double>>& recent, double elapsed,
                                     double tokens) {
  TrainProgress p;
  p.step = step;
  p.steps = steps;
  for (const auto& [loss, acc] : recent) {
    p.loss += loss / static_cast<double>(recent.size());
    p.accuracy += acc / static_cast<double>(recent.size());
  }
  p.elapsed_seconds = elapsed;
  p.tokens_per_second = tokens / std::max(elapsed, 1e-9);
  p.eta_seconds = elapsed / static_cast<double>(std::max<int64_t>(step - first, 1)) * static_cast<double>(steps - step);
  return p;
}

}  // namespace qkv::detail
