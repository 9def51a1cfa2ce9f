// train_lookup: the training loop of the lookup task, its checkpoints and its evaluation.
// Everything that shapes the trajectory (weights, AdamW state, step, the sampler's RNG state) goes
// into the checkpoint, so a resumed run repeats the uninterrupted one bit for bit.
#include <charconv>
#include <chrono>
#include <cmath>
#include <deque>
#include <numeric>
#include <optional>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

#include "train/lookup_task.h"
#include "train/progress.h"
#include "qkv/checkpoint.h"
#include "qkv/layer.h"
#include "qkv/optim.h"
#include "qkv/lookup.h"

namespace qkv {
namespace {

constexpr uint64_t kTrainStream = 0x747261696e696e67ULL;  // "training"
constexpr uint64_t kEvalStream = 0x68656c646f75742eULL;   // "heldout."
constexpr int64_t kEvalBatch = 250;
// A checkpoint's own format entry; qkv.format holds the layer's, so the file loads as a layer.
constexpr const char* kFormatKey = "train.format";
constexpr const char* kCheckpointFormat = "qkv.train.lookup/1";
constexpr std::size_t kWindow = 50;

void check_config(const LookupConfig& c) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw Error("lookup task: " + message);
  };
  require(c.pairs >= 1, fmt::format("pairs must be at least 1, got {}", c.pairs));
  require(c.num_keys >= c.pairs, fmt::format("num_keys ({}) must be at least pairs ({})", c.num_keys, c.pairs));
  require(c.num_values >= 2, fmt::format("num_values must be at least 2, got {}", c.num_values));
  require(c.embed_dim >= 1 && c.heads >= 1 && c.head_dim >= 0,
          fmt::format("embed_dim ({}) and heads ({}) must be >= 1 and head_dim ({}) >= 0", c.embed_dim, c.heads,
                      c.head_dim));
  require(c.batch >= 1, fmt::format("batch must be at least 1, got {}", c.batch));
  require(c.steps >= 0, fmt::format("steps must be >= 0, got {}", c.steps));
  require(std::isfinite(c.lr) && c.lr > 0, fmt::format("learning rate must be finite and > 0, got {}", c.lr));
  require(c.warmup >= 0 && c.checkpoint_every >= 0 && c.threads >= 0,
          "warmup, checkpoint_every and threads must be >= 0");
  require(std::isfinite(c.clip) && c.clip >= 0, fmt::format("clip must be finite and >= 0, got {}", c.clip));
  require(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "weight_decay must be finite and >= 0");
  require(c.eval_examples >= 1, fmt::format("eval_examples must be at least 1, got {}", c.eval_examples));
  require(!c.resume || !c.checkpoint.empty(), "resume needs a checkpoint file");
}

// The settings a checkpoint must share with the run that resumes it.
std::map<std::string, std::string> config_entries(const LookupConfig& c) {
  return {{"train.pairs", std::to_string(c.pairs)},
          {"train.num_keys", std::to_string(c.num_keys)},
          {"train.num_values", std::to_string(c.num_values)},
          {"train.embed_dim", std::to_string(c.embed_dim)},
          {"train.heads", std::to_string(c.heads)},
          {"train.head_dim", std::to_string(c.head_dim)},
          {"train.batch", std::to_string(c.batch)},
          {"train.steps", std::to_string(c.steps)},
          {"train.lr", fmt::format("{}", c.lr)},
          {"train.warmup", std::to_string(c.warmup)},
          {"train.weight_decay", fmt::format("{}", c.weight_decay)},
          {"train.clip", fmt::format("{}", c.clip)},
          {"train.seed", std::to_string(c.seed)}};
}

std::string rng_state(const std::mt19937_64& rng) {
  std::ostringstream out;
  out << rng;
  return out.str();
}

// The window of the last steps' (loss, accuracy), as "loss:accuracy,..." in the shortest form that
// reads back to the same doubles, so a resumed run reports what the uninterrupted one does.
std::string window_entry(const std::deque<std::pair<double, double>>& recent) {
  std::string out;
  for (const auto& [loss, acc] : recent) out += fmt::format("{}{}:{}", out.empty() ? "" : ",", loss, acc);
  return out;
}

std::optional<std::deque<std::pair<double, double>>> parse_window(std::string_view text) {
  std::deque<std::pair<double, double>> recent;
  const char *p = text.data(), *end = text.data() + text.size();
  while (p != end) {
    double loss = 0, acc = 0;
    auto r = std::from_chars(p, end, loss);
    if (r.ec != std::errc() || r.ptr == end || *r.ptr != ':') return std::nullopt;
    r = std::from_chars(r.ptr + 1, end, acc);
    if (r.ec != std::errc() || !std::isfinite(loss) || !std::isfinite(acc)) return std::nullopt;
    recent.emplace_back(loss, acc);
    p = r.ptr;
    if (p != end && (*p != ',' || ++p == end)) return std::nullopt;
  }
  if (recent.size() > kWindow) return std::nullopt;
  return recent;
}

struct TrainState {
  MultiHeadAttention& layer;
  Optimizer& optimizer;
  std::mt19937_64& rng;
  std::deque<std::pair<double, double>>& recent;
};

void write_checkpoint(const LookupConfig& c, const TrainState& s, int64_t step) {
  std::vector<std::pair<std::string, TensorView<const float>>> tensors;
  for (const auto& [name, t] : std::as_const(s.layer).parameters()) tensors.emplace_back(name, t->view());
  for (const auto& entry : s.optimizer.state()) tensors.push_back(entry);
  // The layer's own entries first, so MultiHeadAttention::load reads the checkpoint as a layer.
  std::map<std::string, std::string> meta = s.layer.metadata();
  meta.merge(config_entries(c));
  meta[kFormatKey] = kCheckpointFormat;
  meta["train.step"] = std::to_string(step);
  meta["train.rng"] = rng_state(s.rng);
  meta["train.recent"] = window_entry(s.recent);
  save_checkpoint(c.checkpoint, tensors, meta);
}

// Restores weights, optimizer state and RNG from the checkpoint; returns its step.
int64_t read_checkpoint(const LookupConfig& c, const TrainState& s) {
  Checkpoint ck = load_checkpoint(c.checkpoint);
  const auto& meta = ck.metadata;
  // Before the layer's entries were added, the format was under qkv.format.
  const auto format = meta.find(meta.count(kFormatKey) ? kFormatKey : "qkv.format");
  if (format == meta.end() || format->second != kCheckpointFormat)
    throw Error(fmt::format("checkpoint {} is not a lookup-task checkpoint", c.checkpoint));
  for (const auto& [key, value] : config_entries(c)) {
    const auto it = meta.find(key);
    const std::string theirs = it == meta.end() ? "(missing)" : it->second;
    if (theirs != value)
      throw Error(
          fmt::format("checkpoint {} was written with {}={} but this run has {}={}; resume with the same settings",
                      c.checkpoint, key.substr(6), theirs, key.substr(6), value));
  }
  // All of train.step, a whole number in [0, steps].
  int64_t step = -1;
  if (const auto it = meta.find("train.step"); it != meta.end()) {
    const char* end = it->second.data() + it->second.size();
    const auto [ptr, ec] = std::from_chars(it->second.data(), end, step);
    if (ec != std::errc() || ptr != end || it->second.empty()) step = -1;
  }
  if (step < 0 || step > c.steps || !meta.count("train.rng"))
    throw Error(fmt::format("checkpoint {} has no valid train.step / train.rng entries", c.checkpoint));
  for (const auto& [name, t] : s.layer.parameters()) {
    const auto it = ck.tensors.find(name);
    if (it == ck.tensors.end() ||
        !std::equal(t->shape().begin(), t->shape().end(), it->second.shape().begin(), it->second.shape().end()))
      throw Error(fmt::format("checkpoint {}: weight {} is missing or has the wrong shape", c.checkpoint, name));
    // Training never writes one (a step refuses non-finite gradients), so the file was changed.
    if (const auto bad = find_non_finite(it->second.cview()))
      throw Error(fmt::format("checkpoint {}: weight {}{} = {} must be finite", c.checkpoint, name,
                              shape_string(bad->index), bad->value));
  }
  s.optimizer.load_state(ck.tensors, step);
  for (const auto& [name, t] : s.layer.parameters()) *t = std::move(ck.tensors.at(name));
  std::istringstream in(meta.at("train.rng"));
  in >> s.rng;
  if (in.fail()) throw Error(fmt::format("checkpoint {}: train.rng is not a generator state", c.checkpoint));
  // Checkpoints written before the window was saved start it empty.
  if (const auto it = meta.find("train.recent"); it != meta.end()) {
    auto recent = parse_window(it->second);
    if (!recent)
      throw Error(fmt::format("checkpoint {}: train.recent is not a list of at most {} loss:accuracy pairs",
                              c.checkpoint, kWindow));
    s.recent = std::move(*recent);
  }
  return step;
}

// Accuracy on the held-out examples, drawn again batch by batch from their own stream at each call
// (the same examples every time), so memory stays one batch whatever --eval-examples asks.
double accuracy(const MultiHeadAttention& layer, const detail::LookupTask& task, const LookupConfig& c,
                const AttentionOptions& options) {
  std::mt19937_64 eval_rng(c.seed ^ kEvalStream);
  int64_t correct = 0, total = 0;
  for (int64_t done = 0; done < c.eval_examples; done += kEvalBatch) {
    const detail::LookupBatch batch = task.sample(std::min(kEvalBatch, c.eval_examples - done), eval_rng);
    const Tensor<float> y = layer.forward(batch.x.cview(), {}, options);
    correct += task.readout(y, batch.targets, nullptr, options.num_threads).correct;
    total += static_cast<int64_t>(batch.targets.size());
  }
  return static_cast<double>(correct) / static_cast<double>(total);
}

}  // namespace

LookupResult train_lookup(const LookupConfig& c, const std::function<void(const TrainProgress&)>& progress) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start_time = Clock::now();
  check_config(c);
  if (!c.checkpoint.empty()) check_checkpoint_path(c.checkpoint);
  AttentionOptions options;
  options.num_threads = c.threads;

  const detail::LookupTask task(c);

  LayerConfig lc;
  lc.embed_dim = c.embed_dim;
  lc.num_heads = c.heads;
  lc.head_dim = c.head_dim;
  lc.seed = c.seed;
  MultiHeadAttention layer(lc);
  LookupResult result;
  result.untrained_accuracy = accuracy(layer, task, c, options);
  result.parameter_free_accuracy =
      accuracy(MultiHeadAttention(LayerConfig{.embed_dim = c.embed_dim, .parameter_free = true}), task, c, options);

  Optimizer optimizer(OptimizerConfig{.kind = OptimizerKind::adamw, .weight_decay = c.weight_decay},
                      layer.parameters());
  const LrSchedule schedule{.base = c.lr, .min_lr = c.lr * 0.01, .warmup = c.warmup, .total = c.steps};
  std::mt19937_64 rng(c.seed ^ kTrainStream);
  std::deque<std::pair<double, double>> recent;  // (loss, accuracy) of the last kWindow steps
  const TrainState state{layer, optimizer, rng, recent};
  int64_t first = 0;
  if (c.resume) first = result.resumed_from = read_checkpoint(c, state);

  const Clock::time_point loop_start = Clock::now();
  LayerCache cache;
  TensorMap grads;
  Tensor<float> dy;
  for (int64_t step = first; step < c.steps; ++step) {
    const detail::LookupBatch batch = task.sample(c.batch, rng);
    detail::ReadoutResult r;
    detail::run_training_step(step, [&] {
      const Tensor<float> y = layer.forward(batch.x.cview(), {}, options, &cache);
      r = task.readout(y, batch.targets, &dy, options.num_threads);
      layer.backward(cache, dy.cview(), options, &grads);
    });
    clip_grad_norm(grads, c.clip);
    optimizer.step(grads, schedule.at(step));

    recent.emplace_back(r.loss, static_cast<double>(r.correct) / static_cast<double>(c.batch));
    if (recent.size() > kWindow) recent.pop_front();
    const bool last = step + 1 == c.steps;
    if (!c.checkpoint.empty() && ((c.checkpoint_every > 0 && (step + 1) % c.checkpoint_every == 0) || last))
      write_checkpoint(c, state, step + 1);
    if (progress)
      progress(detail::window_progress(step + 1, first, c.steps, recent,
                                       std::chrono::duration<double>(Clock::now() - loop_start).count(),
                                       static_cast<double>((step + 1 - first) * c.batch * task.sequence_length())));
  }
  // No step ran, so the loop wrote nothing: --checkpoint still gets the run as it starts.
  if (!c.checkpoint.empty() && c.steps == 0 && !c.resume) write_checkpoint(c, state, 0);
  for (const auto& [loss, acc] : recent) result.final_loss += loss / static_cast<double>(recent.size());
  if (!c.save.empty()) layer.save(c.save);
  result.trained_accuracy = accuracy(layer, task, c, options);
  result.seconds = std::chrono::duration<double>(Clock::now() - start_time).count();
  return result;
}

}  // namespace qkv
