// train_masked_word: the training loop of the masked-word task and its held-out comparison with
// the parameter-free layer and the mean-of-context guess (include/qkv/masked_word.h).
#include "qkv/masked_word.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <string_view>

#include <fmt/format.h>

#include "train/masked_word_data.h"
#include "train/progress.h"
#include "qkv/error.h"
#include "qkv/layer.h"
#include "qkv/utf8.h"
#include "qkv/optim.h"
#include "qkv/positions.h"

namespace qkv {
namespace {

constexpr uint64_t kTrainStream = 0x6d61736b2d747261ULL;  // "mask-tra"
constexpr uint64_t kEvalStream = 0x6d61736b2d657661ULL;   // "mask-eva"
constexpr std::size_t kWindow = 50;

// The layer's input: the batch's rows, plus positional encodings when the config asks for them.
Tensor<float> layer_input(const detail::MaskedBatch& batch, bool positions) {
  Tensor<float> x = batch.x.clone();
  if (positions) add_sinusoidal_positions(x.view());
  return x;
}

// The bag-of-words guess: the hidden slot's input itself, which holds the mean of the context
// (halves: the mean of the half the layer reads, at every row).
Tensor<float> mean_of_context(const detail::MaskedBatch& batch) {
  if (batch.objective != MaskedObjective::halves) return batch.x.clone();
  const int64_t B = batch.x.dim(0), L = batch.x.dim(1), E = batch.x.dim(2);
  Tensor<float> y({B, L, E}, "mean of the context");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < E; ++e) {
      double sum = 0.0;
      for (int64_t t = 0; t < L; ++t) sum += batch.x[(b * L + t) * E + e];
      for (int64_t t = 0; t < L; ++t) y[(b * L + t) * E + e] = static_cast<float>(sum / static_cast<double>(L));
    }
  return y;
}

// Held-out top-1/top-10 of `layer` (null: the mean of the context).
TopAccuracy evaluate(const MultiHeadAttention* layer, const std::vector<detail::MaskedBatch>& held_out,
                     const Embeddings& embeddings, bool positions, const AttentionOptions& options) {
  int64_t top1 = 0, top10 = 0, total = 0;
  for (const auto& batch : held_out) {
    const Tensor<float> y =
        layer ? layer->forward(layer_input(batch, positions).cview(), {}, options) : mean_of_context(batch);
    const detail::MaskedReadout r = detail::masked_readout(y, batch, embeddings, nullptr, options.num_threads);
    top1 += r.top1;
    top10 += r.top10;
    total += r.rows;
  }
  return {static_cast<double>(top1) / static_cast<double>(total),
          static_cast<double>(top10) / static_cast<double>(total)};
}

}  // namespace

void check_masked_word_config(const MaskedWordConfig& c) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw Error("masked-word task: " + message);
  };
  require(c.heads >= 1 && c.head_dim >= 0,
          fmt::format("heads ({}) must be >= 1 and head_dim ({}) >= 0", c.heads, c.head_dim));
  // The layer's own bound on a weight (2^40 elements), which it would check only after the files are read.
  require(c.heads <= (int64_t{1} << 40) && c.head_dim <= (int64_t{1} << 40) / c.heads,
          fmt::format("heads · head_dim = {} · {} is too large (at most 2^40)", c.heads, c.head_dim));
  // The corpus keeps one list per length: max_length 10^7 took 700 MB, 10^8 threw std::bad_alloc.
  require(c.min_length >= 2 && c.max_length >= c.min_length && c.max_length <= kMaxSentenceWords,
          fmt::format("sentence lengths must satisfy 2 <= min ({}) <= max ({}) <= {}", c.min_length, c.max_length,
                      kMaxSentenceWords));
  require(invalid_utf8_at(c.note) == std::string_view::npos, "the note is not valid UTF-8");
  require(c.batch >= 1 && c.steps >= 0 && c.warmup >= 0 && c.threads >= 0 && c.eval_examples >= 1,
          "batch and eval_examples must be >= 1; steps, warmup and threads >= 0");
  require(std::isfinite(c.lr) && c.lr > 0, fmt::format("learning rate must be finite and > 0, got {}", c.lr));
  require(std::isfinite(c.clip) && c.clip >= 0, fmt::format("clip must be finite and >= 0, got {}", c.clip));
  require(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "weight_decay must be finite and >= 0");
  require(c.objective != MaskedObjective::halves || c.min_length >= 4,
          fmt::format("the halves objective needs sentences of at least 4 words, got min_length {}", c.min_length));
}

MaskedWordResult train_masked_word(const MaskedWordConfig& c,
                                   const std::function<void(const TrainProgress&)>& progress) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  check_masked_word_config(c);
  AttentionOptions options;
  options.num_threads = c.threads;

  const Embeddings embeddings = Embeddings::load(c.embeddings);
  const detail::MaskedCorpus corpus = detail::load_masked_corpus(c, embeddings);
  std::mt19937_64 eval_rng(c.seed ^ kEvalStream);
  const std::vector<detail::MaskedBatch> held_out =
      detail::held_out_batches(corpus, embeddings, c.eval_examples, eval_rng);

  MaskedWordResult result;
  result.vocabulary = embeddings.size();
  result.train_sentences = corpus.train_count;
  result.excluded_sentences = corpus.excluded;
  for (const auto& b : held_out) {  // halves: every word of the half read is an example
    result.eval_sentences += b.x.dim(0);
    result.eval_examples += b.objective == MaskedObjective::halves ? b.x.dim(0) * b.x.dim(1) : b.x.dim(0);
  }
  LayerConfig lc;
  lc.embed_dim = embeddings.dim();
  lc.num_heads = c.heads;
  lc.head_dim = c.head_dim;
  lc.bias = true;  // the hidden slot's query needs a term of its own
  lc.residual = c.residual;
  lc.seed = c.seed;
  lc.note = c.note;
  MultiHeadAttention layer(lc);
  const MultiHeadAttention free_layer(LayerConfig{.embed_dim = embeddings.dim(), .parameter_free = true});
  result.untrained = evaluate(&layer, held_out, embeddings, c.positions, options);
  result.parameter_free = evaluate(&free_layer, held_out, embeddings, c.positions, options);
  result.mean_context = evaluate(nullptr, held_out, embeddings, false, options);

  Optimizer optimizer(OptimizerConfig{.kind = OptimizerKind::adamw, .weight_decay = c.weight_decay},
                      layer.parameters());
  const LrSchedule schedule{.base = c.lr, .min_lr = c.lr * 0.01, .warmup = c.warmup, .total = c.steps};
  std::mt19937_64 rng(c.seed ^ kTrainStream);
  std::deque<std::pair<double, double>> recent;  // (loss, top-1 accuracy) of the last kWindow steps
  const Clock::time_point loop_start = Clock::now();
  LayerCache cache;
  TensorMap grads;
  Tensor<float> dy;
  int64_t tokens = 0;
  for (int64_t step = 0; step < c.steps; ++step) {
    const detail::MaskedBatch batch = detail::sample_batch(corpus, embeddings, c.batch, rng);
    detail::MaskedReadout r;
    detail::run_training_step(step, [&] {
      const Tensor<float> y = layer.forward(layer_input(batch, c.positions).cview(), {}, options, &cache);
      r = detail::masked_readout(y, batch, embeddings, &dy, options.num_threads);
      layer.backward(cache, dy.cview(), options, &grads);
    });
    clip_grad_norm(grads, c.clip);
    optimizer.step(grads, schedule.at(step));
    tokens += batch.x.dim(0) * batch.x.dim(1);
    recent.emplace_back(r.loss, static_cast<double>(r.top1) / static_cast<double>(r.rows));
    if (recent.size() > kWindow) recent.pop_front();
    if (progress)
      progress(detail::window_progress(step + 1, 0, c.steps, recent,
                                       std::chrono::duration<double>(Clock::now() - loop_start).count(),
                                       static_cast<double>(tokens)));
  }
  for (const auto& [loss, acc] : recent) result.final_loss += loss / static_cast<double>(recent.size());
  if (!c.save.empty()) layer.save(c.save);
  result.trained = evaluate(&layer, held_out, embeddings, c.positions, options);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace qkv
