// The lookup task's data and readout (see include/qkv/lookup.h): fixed random token embeddings,
// seeded example sampling, and the cross-entropy readout against the value embeddings. Internal.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "qkv/tensor.h"
#include "qkv/lookup.h"

namespace qkv::detail {

struct LookupBatch {
  Tensor<float> x;               // [B, P + 1, E]: P pair tokens, then the query token
  std::vector<int64_t> targets;  // [B]: the value id stored under the query's key
};

struct ReadoutResult {
  double loss = 0;  // mean cross-entropy over the batch
  int64_t correct = 0;
};

class LookupTask {
 public:
  // Draws the embedding tables from config.seed (each entry N(0, 1/E)).
  explicit LookupTask(const LookupConfig& config);

  int64_t sequence_length() const { return pairs_ + 1; }

  // B examples: P distinct keys in random order, each with a random value; the query asks one of
  // them. Advances `rng` by a fixed, data-independent amount per example.
  LookupBatch sample(int64_t batch, std::mt19937_64& rng) const;

  // y: [B, P + 1, E] layer output. logits = y[:, P, :] · value_embeddingsᵀ, scored against
  // targets. When dy is not null it is set to dL/dy ([B, P + 1, E], zero except at the query).
  // The products run on up to `threads` threads (detail::sgemm: the same bits for any count).
  ReadoutResult readout(const Tensor<float>& y, const std::vector<int64_t>& targets, Tensor<float>* dy,
                        int threads) const;

 private:
  int64_t pairs_, num_keys_, num_values_, dim_;
  Tensor<float> keys_, values_, marker_;  // [K, E], [V, E], [E]
};

// Uniform integer in [0, n) from the generator's bits (platform-independent, unlike
// std::uniform_int_distribution).
inline int64_t uniform_index(std::mt19937_64& rng, int64_t n) {
  return static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
}

}  // namespace qkv::detail
