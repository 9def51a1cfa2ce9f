// What a training loop reports after every step (the lookup and masked-word tasks alike).
#pragma once

#include <cstdint>

namespace qkv {

// Reported after every step.
struct TrainProgress {
  int64_t step = 0, steps = 0;    // steps done, total
  double loss = 0, accuracy = 0;  // means over the last (up to) 50 steps' batches
  double tokens_per_second = 0;   // tokens processed by this process per wall-clock second
  double elapsed_seconds = 0, eta_seconds = 0;
};

}  // namespace qkv
