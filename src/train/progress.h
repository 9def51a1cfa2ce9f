// What the training loops share (train_lookup, train_masked_word): the progress report (loss and
// accuracy averaged over the last steps, throughput and the time left), and how a step's errors are
// named. Internal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>

#include <fmt/format.h>

#include "qkv/error.h"
#include "qkv/interrupt.h"
#include "qkv/out_of_memory.h"
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

// Runs a step's forward and backward. After the first step their inputs include what training made
// of the weights, so an error there (an output past float32's range, which advises scaling the
// inputs down) says so and names the usual cause.
template <class Step>
void run_training_step(int64_t step, Step&& work) {
  try {
    work();
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Interrupted&) {
    throw;
  } catch (const Error& e) {
    if (step == 0) throw;
    throw Error(
        fmt::format("training step {}: {} (after {} step{} of training: if training diverged, lower the "
                    "learning rate)",
                    step + 1, e.what(), step, step == 1 ? "" : "s"));
  }
}

}  // namespace qkv::detail
