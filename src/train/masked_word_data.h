// The masked-word task's data and readout (see include/qkv/masked_word.h): sentences as word ids
// bucketed by length, batches with one hidden word each, and the cross-entropy readout against
// the whole vocabulary. Internal.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "qkv/embeddings.h"
#include "qkv/masked_word.h"
#include "qkv/tensor.h"

namespace qkv::detail {

using Sentence = std::vector<int32_t>;  // word ids into the embeddings

struct MaskedCorpus {
  std::vector<std::vector<Sentence>> train;  // train[L - min_length]: training sentences of length L
  std::vector<Sentence> held_out;            // one line in 20 (fixed by line number), in file order
  int64_t min_length = 0, train_count = 0;
  int64_t excluded = 0;  // lines dropped because config.exclude lists them
  MaskedObjective objective = MaskedObjective::hidden_slot;
};

// Reads `path` (one sentence per line); keeps sentences whose words are all in `embeddings`, whose
// length is within [min_length, max_length] and that config.exclude does not list. Throws qkv::Error naming the file if
// it cannot be read or leaves no training or no held-out sentence.
MaskedCorpus load_masked_corpus(const MaskedWordConfig& config, const Embeddings& embeddings);

struct MaskedBatch {
  // hidden_slot: [B, L, E], row `hidden[b]` holding the mean of the other rows; halves:
  // [B, L / 2, E], the words of one half of each sentence in their order.
  Tensor<float> x;
  std::vector<int64_t> hidden;   // hidden_slot: [B] the hidden position
  std::vector<int64_t> targets;  // hidden_slot: [B] the hidden word's id
  Tensor<float> halves;          // halves: [B, E] the unit mean of each sentence's other half
  MaskedObjective objective = MaskedObjective::hidden_slot;
};

// A batch of sentences of one length (taken from the bucket of a uniformly drawn sentence), each
// with a uniformly drawn hidden position (halves: a uniformly drawn split).
MaskedBatch sample_batch(const MaskedCorpus& corpus, const Embeddings& embeddings, int64_t batch, std::mt19937_64& rng);

// The held-out examples, at most `examples`, hidden positions drawn from `rng`, grouped into
// batches of one length (at most 250 each).
std::vector<MaskedBatch> held_out_batches(const MaskedCorpus& corpus, const Embeddings& embeddings, int64_t examples,
                                          std::mt19937_64& rng);

struct MaskedReadout {
  double loss = 0;              // mean cross-entropy over the scored rows
  int64_t top1 = 0, top10 = 0;  // scored rows whose target ranks first / within the first 10
  int64_t rows = 0;             // rows scored: B (hidden_slot) or every row of y (halves)
};

// hidden_slot: scores the hidden rows y[b, hidden[b], :] against every embedding (logits =
// y · embeddingsᵀ); halves: every row of y[b] against the batch's other halves (logits = y ·
// halvesᵀ, target b). When dy is not null it is set to dL/dy (y's shape, zero at rows not
// scored) for the mean loss. The products run on up to `threads` threads (the same bits for any count).
MaskedReadout masked_readout(const Tensor<float>& y, const MaskedBatch& batch, const Embeddings& embeddings,
                             Tensor<float>* dy, int threads);

}  // namespace qkv::detail
