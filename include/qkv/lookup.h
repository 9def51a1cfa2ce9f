// Training on the lookup task: attention as the seeds' dictionary ("dict[a] = 2"). Each example is
// P key→value pair tokens followed by one query token carrying a key; the target is that key's
// value. Token vectors are fixed random embeddings (pair = key + value embedding; query = key
// embedding + a query marker). One multi-head self-attention layer (learnable W_q, W_k, W_v, W_o)
// reads the sequence; its output at the query token is scored against every value embedding
// (logits = y_query · value_embeddingsᵀ) under cross-entropy, with AdamW, gradient clipping and a
// warm-up + cosine schedule.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "qkv/train_progress.h"

namespace qkv {

struct LookupConfig {
  int64_t pairs = 8;        // P key→value pairs per example (at most num_keys)
  int64_t num_keys = 32;    // key vocabulary
  int64_t num_values = 32;  // value vocabulary
  int64_t embed_dim = 64;   // E
  int64_t heads = 4;        // H
  int64_t head_dim = 0;     // D; 0 means E / H
  int64_t batch = 64;       // examples per step
  int64_t steps = 1500;
  double lr = 3e-3;      // peak learning rate
  int64_t warmup = 100;  // warm-up steps
  double weight_decay = 0.0;
  double clip = 1.0;  // global gradient norm limit; 0 = off
  uint64_t seed = 1;  // embeddings, initial weights, training and held-out examples
  // Threads for the attention and the matrix products; 0 = default_num_threads(). The weights are
  // the same for any value.
  int threads = 1;
  int64_t eval_examples = 2000;  // held-out examples (drawn from a separate stream)
  std::string checkpoint;        // checkpoint file; empty = none
  int64_t checkpoint_every = 0;  // steps between checkpoints (0: only at the end, if checkpoint is set)
  bool resume = false;           // continue from `checkpoint` (bitwise as if never interrupted)
  std::string save;              // write the trained layer here (MultiHeadAttention::save); empty = don't
};

struct LookupResult {
  double trained_accuracy = 0;         // held-out
  double parameter_free_accuracy = 0;  // the same readout on Q = K = V = X attention
  double untrained_accuracy = 0;       // the layer at its seeded initialization
  double final_loss = 0;               // mean over the last steps, as in TrainProgress
  int64_t resumed_from = 0;            // the checkpoint's step, 0 if not resumed
  double seconds = 0;                  // wall time of this call
};

// Trains and evaluates. Throws qkv::Error for a bad config, an unwritable output, or (with
// resume) a missing, corrupted or mismatched checkpoint. `progress` may be empty. Results are
// bitwise reproducible for a given config and thread count.
LookupResult train_lookup(const LookupConfig& config, const std::function<void(const TrainProgress&)>& progress = {});

}  // namespace qkv
