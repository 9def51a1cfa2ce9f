// `qkv train --task lookup`: trains one attention layer on the lookup task (the library's
// train_lookup does the work) with a progress bar on stderr, then prints held-out accuracies.
#include <unistd.h>

#include <chrono>
#include <limits>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli_util.h"
#include "commands.h"
#include "qkv/lookup.h"

namespace qkv::cli {
namespace {

struct TrainArgs {
  std::string task = "lookup";
  LookupConfig config;
};

std::string duration(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  return s >= 60 ? fmt::format("{}m{:02}s", s / 60, s % 60) : fmt::format("{}s", s);
}

// Redraws one line on a terminal (at most 10 times a second); otherwise prints a plain line
// about every 5% of the run, so logs stay readable.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(int64_t steps) : tty_(::isatty(STDERR_FILENO) == 1), every_(std::max<int64_t>(1, steps / 20)) {}
  ~ProgressPrinter() {
    if (drawn_) std::fputc('\n', stderr);
  }
  void operator()(const TrainProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const bool last = p.step == p.steps;
    if (tty_) {
      if (!last && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      constexpr int kWidth = 24;
      const int filled = static_cast<int>(kWidth * p.step / std::max<int64_t>(p.steps, 1));
      fmt::print(stderr, "\r[{}{}] {}", std::string(filled, '#'), std::string(kWidth - filled, '.'), describe(p));
      drawn_ = true;
    } else if (last || p.step % every_ == 0) {
      fmt::print(stderr, "{}\n", describe(p));
    }
    std::fflush(stderr);
  }

 private:
  static std::string describe(const TrainProgress& p) {
    return fmt::format("step {}/{}  loss {:.4f}  acc {:5.1f}%  {:.0f} tok/s  ETA {}   ", p.step, p.steps, p.loss,
                       100.0 * p.accuracy, p.tokens_per_second, duration(p.eta_seconds));
  }
  bool tty_;
  int64_t every_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

int run_train(const TrainArgs& args) {
  const LookupConfig& c = args.config;
  if (!c.save.empty()) check_output_path(c.save, "--save");
  if (!c.checkpoint.empty()) check_output_path(c.checkpoint, "--checkpoint");
  LookupResult r;
  {
    ProgressPrinter printer(c.steps);
    r = train_lookup(c, [&](const TrainProgress& p) { printer(p); });
  }
  if (r.resumed_from > 0) fmt::print("resumed from step {} of {}\n", r.resumed_from, c.steps);
  fmt::print("held-out accuracy ({} examples; chance {:.1f}%):\n", c.eval_examples, 100.0 / c.num_values);
  fmt::print("  trained         {:6.2f}%\n", 100.0 * r.trained_accuracy);
  fmt::print("  parameter-free  {:6.2f}%\n", 100.0 * r.parameter_free_accuracy);
  fmt::print("  untrained       {:6.2f}%\n", 100.0 * r.untrained_accuracy);
  fmt::print("final training loss {:.4f}; {} steps in {}\n", r.final_loss, c.steps, duration(r.seconds));
  if (!c.save.empty()) fmt::print("weights written to {}\n", c.save);
  return 0;
}

}  // namespace

Command add_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  LookupConfig& c = args->config;
  CLI::App* sub = app.add_subcommand(
      "train",
      "Train one multi-head attention layer by backpropagation.\n"
      "--task lookup: P key->value pair tokens then a query token carrying a key; predict that key's value.");
  sub->add_option("--task", args->task, "Task (lookup)")->check(CLI::IsMember({"lookup"}))->capture_default_str();
  sub->add_option("--pairs,-P", c.pairs, "Key->value pairs per example")->check(integer_in(1, 100000))->capture_default_str();
  sub->add_option("--keys", c.num_keys, "Key vocabulary size")->check(integer_in(1, 1000000))->capture_default_str();
  sub->add_option("--values", c.num_values, "Value vocabulary size")->check(integer_in(2, 1000000))->capture_default_str();
  sub->add_option("--embed-dim,-E", c.embed_dim, "Embedding width E")->check(integer_in(1, 65536))->capture_default_str();
  sub->add_option("--heads", c.heads, "Attention heads H")->check(integer_in(1, 1024))->capture_default_str();
  sub->add_option("--head-dim,-D", c.head_dim, "Head dim D (0: E / heads)")->check(integer_in(0, 65536))->capture_default_str();
  sub->add_option("--batch", c.batch, "Examples per step")->check(integer_in(1, 1000000))->capture_default_str();
  sub->add_option("--steps", c.steps, "Training steps")->check(integer_in(int64_t{0}, int64_t{1} << 40))->capture_default_str();
  sub->add_option("--lr", c.lr, "Peak learning rate (AdamW, warm-up + cosine)")->check(positive_number())->capture_default_str();
  sub->add_option("--warmup", c.warmup, "Warm-up steps")->check(integer_in(0, std::numeric_limits<int64_t>::max()))->capture_default_str();
  sub->add_option("--clip", c.clip, "Gradient norm limit (0: off)")->check(nonnegative_number())->capture_default_str();
  sub->add_option("--weight-decay", c.weight_decay, "AdamW weight decay")->check(nonnegative_number())->capture_default_str();
  sub->add_option("--seed", c.seed, "Seed of embeddings, weights and data")->capture_default_str();
  sub->add_option("--threads", c.threads, "Threads (0: QKV_NUM_THREADS or all cores); the default task is fastest on 1")
      ->check(integer_in(0, 4096))
      ->capture_default_str();
  sub->add_option("--eval-examples", c.eval_examples, "Held-out examples")->check(integer_in(1, 10000000))->capture_default_str();
  sub->add_option("--checkpoint", c.checkpoint, "Checkpoint file (.safetensors); the previous one is kept as <file>.prev");
  sub->add_option("--checkpoint-every", c.checkpoint_every, "Steps between checkpoints (0: only at the end)")
      ->check(integer_in(0, std::numeric_limits<int64_t>::max()));
  sub->add_flag("--resume", c.resume, "Continue from --checkpoint (bitwise as if never interrupted)");
  sub->add_option("--save", c.save, "Write the trained layer (.safetensors; usable with --weights)");
  sub->callback([args, sub] {
    if (args->config.resume && args->config.checkpoint.empty()) usage_error("--resume needs --checkpoint FILE");
    if (sub->count("--checkpoint-every") > 0 && args->config.checkpoint.empty())
      usage_error("--checkpoint-every needs --checkpoint FILE");
    if (args->config.num_keys < args->config.pairs)
      usage_error(fmt::format("--keys ({}) must be at least --pairs ({})", args->config.num_keys, args->config.pairs));
  });
  return {sub, [args] { return run_train(*args); }};
}

}  // namespace qkv::cli
