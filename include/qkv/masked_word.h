// Training on real text: the masked-word task. Each example is one sentence of a corpus (one
// sentence per line, e.g. the GCIDE sentences scripts/make_embeddings.py writes) with one word
// hidden. Every word is its static vector from a fixed embeddings file; the hidden word's slot
// holds the mean of the other words' vectors (the bag-of-words guess), so its query is a vector
// of the same kind as a real word's and W_q learns from real embeddings. One multi-head
// self-attention layer (W_q, W_k, W_v, W_o with biases) reads the sentence; its output at the
// hidden slot is scored against every word of the vocabulary (logits = y · embeddingsᵀ) under
// cross-entropy, with AdamW, gradient clipping and a warm-up + cosine schedule.
//
// The context objective (MaskedObjective::halves, `qkv train --task context`) scores every word's
// output instead: each sentence is split at random into two halves, the layer reads one half, and
// each of its words' outputs must pick out the other half (the unit mean of its static vectors)
// among the batch's sentences (cross-entropy over logits y · halfᵀ, in-batch negatives). Only the
// hidden slot is scored in the classic task, so nothing there rewards a visible word's output for
// carrying its sentence's topic; here every output is, which is what tells "bank" by a river from
// "bank" with money. With a residual (y = x + attention), the layer learns what the context adds
// to each word.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "qkv/train_progress.h"

namespace qkv {

enum class MaskedObjective { hidden_slot, halves };

// The longest sentence a corpus may be asked to use (MaskedWordConfig::max_length).
inline constexpr int64_t kMaxSentenceWords = 4096;

struct MaskedWordConfig {
  MaskedObjective objective = MaskedObjective::hidden_slot;
  bool residual = false;                    // the layer's output is x + attention (LayerConfig::residual)
  std::string embeddings;                   // word vectors (GloVe / word2vec); their width is the layer's E
  std::string sentences;                    // text, one sentence per line (tokenized as qkv's tokenize())
  int64_t heads = 2;                        // H
  int64_t head_dim = 0;                     // D; 0 means E / H
  int64_t min_length = 4, max_length = 16;  // sentences of other lengths are not used (halves: min 4;
                                            // max at most kMaxSentenceWords)
  int64_t max_sentences = 0;                // read at most this many lines (0: all)
  int64_t batch = 64;                       // sentences per step (all of one length)
  int64_t steps = 3000;
  double lr = 3e-3;  // peak learning rate
  int64_t warmup = 100;
  double weight_decay = 0.0;
  double clip = 1.0;             // global gradient norm limit; 0 = off
  bool positions = false;        // add sinusoidal positional encodings (qkv/positions.h) to the input rows
  uint64_t seed = 1;             // initial weights, training batches and held-out hidden positions
  int threads = 1;               // attention and product threads (0 = default_num_threads()); the
                                 // weights are the same for any value
  int64_t eval_examples = 2000;  // held-out sentences (one sentence in 20, fixed by line number)
  std::string save;              // write the trained layer here (MultiHeadAttention::save); empty = don't
  std::string exclude = {};      // a file of sentences (one per line) never trained on, e.g. an evaluation's
  std::string note = {};         // saved with the layer (LayerConfig::note)
};

// Held-out accuracy of one predictor: the hidden word is the best-scoring word / among the 10 best.
struct TopAccuracy {
  double top1 = 0, top10 = 0;
};

struct MaskedWordResult {
  TopAccuracy trained;         // the trained layer
  TopAccuracy parameter_free;  // Q = K = V = X attention (seed 002), the same readout
  TopAccuracy mean_context;    // the hidden slot's input itself: the mean of the context vectors
  TopAccuracy untrained;       // the layer at its seeded initialization
  double final_loss = 0;       // mean over the last (up to) 50 steps
  int64_t vocabulary = 0, train_sentences = 0, eval_examples = 0;
  int64_t excluded_sentences = 0;  // training lines dropped because config.exclude lists them
  int64_t eval_sentences = 0;      // held-out sentences (eval_examples counts the scored words)
  double seconds = 0;
};

// Throws qkv::Error "masked-word task: <what>" for a config train_masked_word refuses (sizes,
// sentence lengths, rates; the halves objective's sentences of at least 4 words), without reading
// any file: a front end can check its options before any work.
void check_masked_word_config(const MaskedWordConfig& config);

// Loads the embeddings and sentences, trains and evaluates. Throws qkv::Error for a bad config, an
// unreadable file, a corpus with no usable training or held-out sentence, or an unwritable --save.
// `progress` (may be empty) runs after every step. Bitwise reproducible for a config and thread count.
MaskedWordResult train_masked_word(const MaskedWordConfig& config,
                                   const std::function<void(const TrainProgress&)>& progress = {});

}  // namespace qkv
