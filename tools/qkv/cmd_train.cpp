// `qkv train`: trains one attention layer on the lookup task (train_lookup) or on real sentences
// (--task masked-word, train_masked_word) with a progress bar on stderr, then prints held-out
// accuracies and, if asked, the loss curve as CSV and SVG.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "cli_interrupt.h"
#include "cli_loss_curve.h"
#include "cli_util.h"
#include "commands.h"
#include "qkv/lookup.h"
#include "qkv/masked_word.h"
#include "qkv/out_of_memory.h"
#include "qkv/utf8.h"

namespace qkv::cli {
namespace {

// --task context's defaults (chosen by the sense evaluation; see context_defaults).
constexpr int64_t kContextSteps = 1500;
constexpr int64_t kContextBatch = 64;

struct TrainArgs {
  std::string task = "lookup";
  LookupConfig config;
  MaskedWordConfig masked;
  std::string loss_csv, loss_svg;
};

std::string duration(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  return s >= 60 ? fmt::format("{}m{:02}s", s / 60, s % 60) : fmt::format("{}s", s);
}

// Redraws one line on a terminal (at most 10 times a second); otherwise prints a plain line
// about every 5% of the run, so logs stay readable.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(int64_t steps)
      : tty_(::isatty(STDERR_FILENO) == 1), every_(std::max<int64_t>(1, steps / 20)) {}
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
      print_to_stderr(
          fmt::format("\r[{}{}] {}", std::string(filled, '#'), std::string(kWidth - filled, '.'), describe(p)));
      drawn_ = true;
    } else if (last || p.step % every_ == 0) {
      print_to_stderr(describe(p) + "\n");
    }
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

// The context task's own defaults, where they differ from masked-word's: the layer that `make demo`
// trains and the sense evaluation measures (scripts/sense_eval.py).
void context_defaults(const CLI::App* sub, MaskedWordConfig& m) {
  m.objective = MaskedObjective::halves;
  m.residual = true;
  auto unless_given = [sub](const char* name, auto& field, auto value) {
    if (sub->count(name) == 0) field = value;
  };
  unless_given("--steps", m.steps, kContextSteps);
  unless_given("--batch", m.batch, kContextBatch);
}

void validate(const CLI::App* sub, TrainArgs& a) {
  const bool masked = a.task != "lookup";
  if (a.task != "context" && sub->count("--exclude") > 0) usage_error("--exclude applies only to --task context");
  for (const char* name :
       {"--pairs", "--keys", "--values", "--embed-dim", "--checkpoint", "--checkpoint-every", "--resume"})
    if (masked && sub->count(name) > 0) usage_error(fmt::format("{} applies only to --task lookup", name));
  for (const char* name :
       {"--embeddings", "--sentences", "--max-sentences", "--min-length", "--max-length", "--positions"})
    if (!masked && sub->count(name) > 0)
      usage_error(fmt::format("{} applies only to --task masked-word and context", name));
  if (a.config.resume && a.config.checkpoint.empty()) usage_error("--resume needs --checkpoint FILE");
  if (sub->count("--checkpoint-every") > 0 && a.config.checkpoint.empty())
    usage_error("--checkpoint-every needs --checkpoint FILE");
  if (!masked && a.config.num_keys < a.config.pairs)
    usage_error(fmt::format("--keys ({}) must be at least --pairs ({})", a.config.num_keys, a.config.pairs));
  if (!masked) return;
  SentenceArgs where;
  where.embeddings = a.masked.embeddings;
  resolve_default_embeddings(where);
  a.masked.embeddings = where.embeddings;
  if (a.masked.sentences.empty())
    a.masked.sentences = (std::filesystem::path(a.masked.embeddings).parent_path() / "sentences.txt").string();
  if (a.task == "context") context_defaults(sub, a.masked);
  try {  // option values the task refuses (lengths, the context task's 4 words) are usage errors
    check_masked_word_config(a.masked);
  } catch (const Error& e) {
    usage_error(e.what());
  }
}

void print_accuracy(const char* name, const TopAccuracy& t) {
  fmt::print("  {:<34} {:6.2f}%  {:6.2f}%\n", name, 100.0 * t.top1, 100.0 * t.top10);
}

// Where a run stands, for the line Ctrl-C prints: the step it started from and the last step done.
struct RunPosition {
  int64_t first = -1, done = -1;
};

// Runs the task with the progress bar and, if asked, records the loss curve; Ctrl-C stops it
// after the step in progress (whose checkpoint, if due, is then written).
template <class Config, class Run>
auto train_with_progress(const Config& c, std::vector<LossPoint>& curve, Run run, RunPosition& at,
                         const StopOnCtrlC& ctrl_c) {
  ProgressPrinter printer(c.steps);
  return run(c, [&](const TrainProgress& p) {
    printer(p);
    curve.push_back({p.step, p.loss, p.accuracy});
    if (at.first < 0) at.first = p.step - 1;
    at.done = p.step;
    ctrl_c.check();
  });
}

// What a run stopped (Ctrl-C, out of memory) after at.done steps kept (a lookup checkpoint is written after
// every checkpoint_every-th step and the last one, before that step's progress is reported).
std::string kept_after_stop(const LookupConfig* c, const RunPosition& at) {
  if (c == nullptr || c->checkpoint.empty()) return "nothing was saved";
  int64_t saved = at.done == c->steps       ? at.done
                  : c->checkpoint_every > 0 ? at.done / c->checkpoint_every * c->checkpoint_every
                                            : 0;
  if (c->resume) saved = std::max(saved, at.first);
  if (saved <= 0 || at.done < 0)
    return c->resume ? fmt::format("the checkpoint {} is as it was: add --resume again to go on", c->checkpoint)
                     : fmt::format("no checkpoint was written yet ({})",
                                   c->checkpoint_every > 0
                                       ? fmt::format("the first is due after step {}", c->checkpoint_every)
                                       : "--checkpoint-every 0 writes it only at the end");
  return fmt::format("the checkpoint {} holds step {}: add --resume to go on from there", c->checkpoint, saved);
}

// "before the first step" or "after step N of M": where a run that did not finish stopped.
std::string stopped_where(const TrainArgs& args, const RunPosition& at) {
  const int64_t steps = args.task == "lookup" ? args.config.steps : args.masked.steps;
  return at.done < 0 ? "before the first step" : fmt::format("after step {} of {}", at.done, steps);
}

// A run that ran out of memory: where, what could not be allocated (`what`), what it kept, and the
// options that size the memory a run takes (its steps do not).
std::string out_of_memory_message(const TrainArgs& args, const RunPosition& at, const std::string& what) {
  const bool lookup = args.task == "lookup";
  const LookupConfig& c = args.config;
  const MaskedWordConfig& m = args.masked;
  const std::string options =
      lookup ? fmt::format(
                   "a smaller --batch ({}), fewer --pairs ({}), a narrower --embed-dim ({}) or fewer --values ({})",
                   c.batch, c.pairs, c.embed_dim, c.num_values)
             : fmt::format(
                   "a smaller --batch ({}), shorter sentences (--max-length {}), fewer of them (--max-sentences) "
                   "or smaller word vectors than {}",
                   m.batch, m.max_length, file_name(m.embeddings));
  return fmt::format("training ran out of memory {}: {}; {}; for less memory, try {}", stopped_where(args, at), what,
                     kept_after_stop(lookup ? &c : nullptr, at), options);
}

// The curve is written after the run has saved its layer (and checkpoint): a failure here says
// that they are kept, since a long run's weights are worth more than its chart.
void write_curve(const TrainArgs& a, const std::vector<LossPoint>& curve) {
  std::vector<std::pair<std::string, std::string>> files;
  if (!a.loss_csv.empty()) files.emplace_back(a.loss_csv, loss_curve_csv(curve));
  if (!a.loss_svg.empty()) files.emplace_back(a.loss_svg, loss_curve_svg(curve, "qkv train --task " + a.task));
  try {
    write_outputs(files);
  } catch (const Error& e) {
    if (a.config.save.empty()) throw;  // --save sets both tasks' configs
    throw Error(fmt::format("{} (the trained layer is saved in {})", e.what(), a.config.save));
  }
  for (const auto& [path, bytes] : files) fmt::print("loss curve written to {}\n", path);
}

// The run's last line: its final loss, or that no step ran (--steps 0: the weights as created or
// resumed, and no loss was ever measured, so none is shown). A warm-up as long as the run
// (LrSchedule) never reached --lr, as PyTorch's schedulers allow; the line says so, since --steps
// alone shortens a run below the default warm-up.
void print_final_loss(double loss, int64_t steps, int64_t warmup, double seconds, std::string_view note = "") {
  if (steps == 0) {
    fmt::print("no training steps (--steps 0){}\n", note);
    return;
  }
  fmt::print("final training loss {:.4f}; {} steps in {}{}\n", loss, steps, duration(seconds), note);
  if (warmup >= steps)
    fmt::print(
        "note: --warmup {} is not below --steps {}: the learning rate rose over the whole run and reached {:.3g}% of "
        "--lr\n",
        warmup, steps, 100.0 * static_cast<double>(steps) / static_cast<double>(warmup));
}

// A file's name as text: the note is saved as JSON, which holds only UTF-8, and a name's other
// bytes would fail the save after every step had run.
std::string text_name(const std::string& path) { return repair_utf8(file_name(path), InvalidUtf8::replace); }

// What the saved layer says of itself (LayerConfig::note): the sentence commands print it.
std::string training_note(const TrainArgs& a) {
  const MaskedWordConfig& m = a.masked;
  return fmt::format(
      "trained by `qkv train --task {}` ({} steps of {} sentences, seed {}{}) on {}, with the word "
      "vectors {}",
      a.task, m.steps, m.batch, m.seed, m.positions ? ", sinusoidal positions" : "", text_name(m.sentences),
      text_name(m.embeddings));
}

int run_masked_word(const TrainArgs& a, std::vector<LossPoint>& curve, RunPosition& at, const StopOnCtrlC& ctrl_c) {
  MaskedWordConfig m = a.masked;
  m.note = training_note(a);
  const MaskedWordResult r = train_with_progress(m, curve, &train_masked_word, at, ctrl_c);
  const std::string left_out =
      r.excluded_sentences > 0 ? fmt::format(", {} left out by --exclude", r.excluded_sentences) : "";
  if (m.objective == MaskedObjective::halves)
    fmt::print(
        "held-out sentences ({} words of {} sentences not trained on, each picking its sentence's other half "
        "among up to 250; {} training sentences{}):\n",
        r.eval_examples, r.eval_sentences, r.train_sentences, left_out);
  else
    fmt::print(
        "held-out hidden words ({} sentences not trained on; {} words to choose from, {} training "
        "sentences{}):\n",
        r.eval_examples, r.vocabulary, r.train_sentences, left_out);
  fmt::print("  {:<34} {:>7}  {:>7}\n", "predictor", "top-1", "top-10");
  print_accuracy("trained layer", r.trained);
  print_accuracy("mean of the context vectors", r.mean_context);
  print_accuracy("parameter-free (Q = K = V = X)", r.parameter_free);
  print_accuracy("untrained layer (its seed)", r.untrained);
  print_final_loss(r.final_loss, m.steps, m.warmup, r.seconds, m.positions ? " (with sinusoidal positions)" : "");
  if (!m.save.empty())
    fmt::print("weights written to {} (qkv explain --weights {}{} \"a sentence\")\n", m.save, m.save,
               m.positions ? " --positions" : "");
  return 0;
}

int train_and_report(const TrainArgs& args, RunPosition& at, const StopOnCtrlC& ctrl_c) {
  const LookupConfig& c = args.config;
  // --save may name an existing directory, which MultiHeadAttention::save fills with a file per
  // tensor and its config: each of those is an output the others must not name.
  std::vector<std::pair<std::string, std::string>> outputs;
  std::error_code ec;  // a path with no status is an output file, whose writer names the fault
  if (!c.save.empty() && std::filesystem::is_directory(c.save, ec)) {
    if (::access(c.save.c_str(), W_OK) != 0)
      throw Error(fmt::format("--save {}: the directory is not writable ({})", c.save, std::strerror(errno)));
    for (const std::string& file : MultiHeadAttention::directory_files())
      outputs.emplace_back("--save", (std::filesystem::path(c.save) / file).string());
  } else {
    outputs.emplace_back("--save", c.save);
  }
  outputs.insert(outputs.end(),
                 {{"--checkpoint", c.checkpoint}, {"--loss-csv", args.loss_csv}, {"--loss-svg", args.loss_svg}});
  const MaskedWordConfig& m = args.masked;
  const bool sentences = args.task != "lookup";
  check_output_paths(outputs, {{"the word vectors", sentences ? m.embeddings : ""},
                               {"the sentences", sentences ? m.sentences : ""},
                               {"--exclude", m.exclude}});
  std::vector<LossPoint> curve;
  if (args.task != "lookup") {
    run_masked_word(args, curve, at, ctrl_c);
    write_curve(args, curve);
    return 0;
  }
  const LookupResult r = train_with_progress(c, curve, &train_lookup, at, ctrl_c);
  if (r.resumed_from > 0) fmt::print("resumed from step {} of {}\n", r.resumed_from, c.steps);
  fmt::print("held-out accuracy ({} examples; chance {:.1f}%):\n", c.eval_examples, 100.0 / c.num_values);
  fmt::print("  trained         {:6.2f}%\n", 100.0 * r.trained_accuracy);
  fmt::print("  parameter-free  {:6.2f}%\n", 100.0 * r.parameter_free_accuracy);
  fmt::print("  untrained       {:6.2f}%\n", 100.0 * r.untrained_accuracy);
  print_final_loss(r.final_loss, c.steps, c.warmup, r.seconds);
  if (!c.save.empty()) fmt::print("weights written to {}\n", c.save);
  write_curve(args, curve);
  return 0;
}

// Ctrl-C ends the run with a line on what it kept, and exit status 130; running out of memory, with
// one that also says which options take less.
int run_train(const TrainArgs& args) {
  const StopOnCtrlC ctrl_c;
  RunPosition at;
  try {
    return train_and_report(args, at, ctrl_c);
  } catch (const Interrupted&) {
    print_to_stderr(fmt::format("qkv: train interrupted {}; {}\n", stopped_where(args, at),
                                kept_after_stop(args.task == "lookup" ? &args.config : nullptr, at)));
    return kInterruptedExit;
  } catch (const OutOfMemory& e) {
    throw Error(out_of_memory_message(args, at, e.what()));
  } catch (const std::bad_alloc&) {
    throw Error(out_of_memory_message(args, at, "an allocation of a size not known failed"));
  }
}

}  // namespace

// Binds an option shared by both tasks to both configs (each keeps its own default otherwise).
template <class T>
CLI::Option* add_shared(CLI::App* sub, const std::string& name, T& lookup, T& masked, const std::string& help,
                        bool show_defaults = true) {
  return sub->add_option_function<T>(
      name, [&lookup, &masked](const T& v) { lookup = masked = v; },
      show_defaults
          ? fmt::format("{} (default: lookup {}, masked-word {}; context: as masked-word but --steps {} --batch {})",
                        help, lookup, masked, kContextSteps, kContextBatch)
          : help);
}

Command add_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  LookupConfig& c = args->config;
  MaskedWordConfig& m = args->masked;
  CLI::App* sub = app.add_subcommand(
      "train",
      "Train one multi-head attention layer by backpropagation.\n"
      "--task lookup: P key->value pair tokens then a query token carrying a key; predict that key's value.\n"
      "--task masked-word: real sentences (the GCIDE sentences `make demo` writes next to the word vectors) with\n"
      "one word hidden; predict it from its context at the embeddings' width.\n"
      "--task context: the same sentences, each split at random into two halves; every word's output of one\n"
      "half (x + attention) must pick out its sentence's other half among the batch's. The layer `make demo`\n"
      "trains: its outputs tell word senses apart.");
  sub->add_option("--task", args->task, "Task (lookup, masked-word, context)")
      ->check(CLI::IsMember({"lookup", "masked-word", "context"}))
      ->capture_default_str();
  sub->add_option("--pairs,-P", c.pairs, "Key->value pairs per example")
      ->check(integer_in(1, 100000))
      ->capture_default_str();
  sub->add_option("--keys", c.num_keys, "Key vocabulary size")->check(integer_in(1, 1000000))->capture_default_str();
  sub->add_option("--values", c.num_values, "Value vocabulary size")
      ->check(integer_in(2, 1000000))
      ->capture_default_str();
  sub->add_option("--embed-dim,-E", c.embed_dim, "Embedding width E (lookup; masked-word takes the embeddings' width)")
      ->check(integer_in(1, 65536))
      ->capture_default_str();
  add_shared(sub, "--heads", c.heads, m.heads, "Attention heads H")->check(integer_in(1, 1024));
  add_shared(sub, "--head-dim,-D", c.head_dim, m.head_dim, "Head dim D (0: E / heads)")->check(integer_in(0, 65536));
  add_shared(sub, "--batch", c.batch, m.batch, "Examples per step")->check(integer_in(1, 1000000));
  add_shared(sub, "--steps", c.steps, m.steps, "Training steps")->check(integer_in(int64_t{0}, int64_t{1} << 40));
  add_shared(sub, "--lr", c.lr, m.lr, "Peak learning rate (AdamW, warm-up + cosine)")->check(positive_number());
  add_shared(sub, "--warmup", c.warmup, m.warmup, "Warm-up steps")
      ->check(integer_in(0, std::numeric_limits<int64_t>::max()));
  add_shared(sub, "--clip", c.clip, m.clip, "Gradient norm limit (0: off)")->check(nonnegative_number());
  add_shared(sub, "--weight-decay", c.weight_decay, m.weight_decay, "AdamW weight decay")->check(nonnegative_number());
  add_shared(sub, "--seed", c.seed, m.seed, "Random seed of weights and data (and the lookup task's embeddings)", false)
      ->check(any_uint64());
  add_shared(
      sub, "--threads", c.threads, m.threads,
      "Threads of the attention and the matrix products (0: QKV_NUM_THREADS or all cores); the weights are the same "
      "for any count")
      ->check(integer_in(0, 4096));
  add_shared(sub, "--eval-examples", c.eval_examples, m.eval_examples, "Held-out examples")
      ->check(integer_in(1, 10000000));
  sub->add_option("--checkpoint", c.checkpoint,
                  "Checkpoint file (.safetensors); the previous one is kept as <file>.prev");
  sub->add_option("--checkpoint-every", c.checkpoint_every, "Steps between checkpoints (0: only at the end)")
      ->check(integer_in(0, std::numeric_limits<int64_t>::max()));
  sub->add_flag("--resume", c.resume, "Continue from --checkpoint (bitwise as if never interrupted)");
  add_shared(sub, "--save", c.save, m.save, "Write the trained layer (.safetensors; usable with --weights)", false);
  sub->add_option("--embeddings", m.embeddings, "masked-word: word vectors; " + default_embeddings_rule());
  sub->add_option("--sentences", m.sentences,
                  "masked-word: one sentence per line (default: sentences.txt next to the "
                  "embeddings)");
  sub->add_option("--max-sentences", m.max_sentences, "masked-word: read at most this many lines (0: all)")
      ->check(integer_in(int64_t{0}, std::numeric_limits<int64_t>::max()));
  sub->add_option("--min-length", m.min_length, "masked-word: shortest sentence used (words)")
      ->check(integer_in(int64_t{2}, kMaxSentenceWords))
      ->capture_default_str();
  sub->add_option("--max-length", m.max_length, "masked-word: longest sentence used (words)")
      ->check(integer_in(int64_t{2}, kMaxSentenceWords))
      ->capture_default_str();
  sub->add_flag("--positions", m.positions, "masked-word: add sinusoidal positional encodings to the input rows");
  sub->add_option("--exclude", m.exclude,
                  "context: a file of sentences (one per line) never trained on, e.g. an evaluation's");
  sub->add_option("--loss-csv", args->loss_csv, "Write the loss curve (step, loss, accuracy) as CSV");
  sub->add_option("--loss-svg", args->loss_svg, "Draw the loss curve as an SVG chart");
  sub->callback([args, sub] { validate(sub, *args); });
  return {sub, [args] { return run_train(*args); }};
}

}  // namespace qkv::cli
