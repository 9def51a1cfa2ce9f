// Options and set-up shared by the sentence commands (explain, context, compare): embeddings,
// the out-of-vocabulary policy and the attention layer.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "cli_util.h"
#include "qkv/error.h"
#include "qkv/positions.h"

namespace qkv::cli {

void add_sentence_options(CLI::App* app, SentenceArgs& args, bool embeddings_required) {
  app->add_option("--embeddings", args.embeddings,
                  "Static word embeddings: GloVe text, word2vec text or binary (told apart by content); " +
                      default_embeddings_rule());
  app->add_option("--oov", args.oov, "Out-of-vocabulary words: error (list them), zero (zero vector) or skip")
      ->check(CLI::IsMember({"error", "zero", "skip"}));
  CLI::Option* weights = app->add_option(
      "--weights", args.weights,
      fmt::format("Layer weights (.safetensors written by MultiHeadAttention::save); default: the trained layer "
                  "{} beside the word vectors (`make demo` builds it)",
                  kDefaultLayerName));
  CLI::Option* seed = app->add_option("--random-weights,--seed", args.seed,
                                      "A random layer instead of the trained one: W_q, W_k, W_v uniform from SEED")
                          ->check(any_uint64());
  CLI::Option* heads =
      app->add_option("--heads", args.heads, "Attention heads of a random layer (implies a random layer)")
          ->check(integer_in(int64_t{1}, int64_t{4096}));
  CLI::Option* dk = app->add_option("--dk", args.dk, "Head dimension d_k of a random layer (default E / heads)")
                        ->check(integer_in(int64_t{1}, int64_t{1} << 20));
  CLI::Option* free = app->add_flag("--parameter-free", args.parameter_free,
                                    "No weights: Q = K = V = X, as in seed 002's first-principles attention");
  app->add_flag("--positions", args.positions,
                "Add sinusoidal positional encodings to X (\"Attention Is All You Need\"), so word order matters");
  weights->excludes(heads)->excludes(dk)->excludes(seed)->excludes(free);
  free->excludes(heads)->excludes(dk)->excludes(seed);
  on_parse_complete(app, [&args, seed, heads, dk, embeddings_required] {
    args.random = seed->count() + heads->count() + dk->count() > 0;
    if (embeddings_required) resolve_default_embeddings(args);  // explain: only for a sentence
  });
}

namespace {

constexpr std::size_t kMaxInputBytes = std::size_t{256} << 20;  // far beyond any sentence a page can show

// The whole of `path` ("-": standard input) as text; refuses a directory, an unreadable file and
// more than kMaxInputBytes, naming `option`.
std::string read_input(const std::string& path, const std::string& option) {
  const std::string name = path == "-" ? "standard input" : path;
  std::FILE* f = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw Error(fmt::format("{} {}: {}", option, name, std::strerror(errno)));
  std::string text;
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    text.append(buf, n);
    if (text.size() > kMaxInputBytes) break;
  }
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  if (f != stdin) std::fclose(f);
  if (failed) throw Error(fmt::format("{} {}: {}", option, name, std::strerror(err)));
  if (text.size() > kMaxInputBytes)
    throw Error(fmt::format("{} {}: more than {} MiB of text", option, name, kMaxInputBytes >> 20));
  return text;
}

// The non-blank lines of `text` (compare's two sentences).
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

// One sentence read whole from a file or standard input: its final newline is no part of it.
std::string sentence_text(const std::string& text) { return text.substr(0, text.find_last_not_of(" \t\r\n") + 1); }

// A positional sentence "-" is read from standard input.
CLI::Validator dash_reads_stdin() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        if (value != "-") return {};
        try {
          value = sentence_text(read_input("-", "sentence"));
        } catch (const Error& e) {
          return e.what();
        }
        return {};
      },
      "", "");
}

}  // namespace

void add_sentence_input(CLI::App* app, CLI::Option* positional, std::vector<std::string>* sentences,
                        std::string* sentence) {
  positional->transform(dash_reads_stdin());
  const std::size_t expected = sentences != nullptr ? 2 : 1;
  CLI::Option* input = app->add_option_function<std::string>(
      "--input",
      [=](const std::string& path) {
        const std::string text = read_input(path, "--input");
        if (sentence != nullptr) {
          *sentence = sentence_text(text);
          return;
        }
        std::vector<std::string> lines = lines_of(text);
        if (lines.size() != expected)
          throw Error(fmt::format(  // the file's content, not the command line: exit 1
              "--input {}: expected {} non-blank lines (one sentence each), found {}", path, expected, lines.size()));
        *sentences = std::move(lines);
      },
      sentences != nullptr ? "Read the two sentences from FILE, one per line ('-': standard input)"
                           : "Read the sentence from FILE ('-': standard input), e.g. one longer than the "
                             "command-line limit");
  input->excludes(positional);
  // Given neither way, the sentence is missing: a usage error, as a missing positional is.
  if (positional->get_required()) {
    positional->required(false);
    on_parse_complete(app, [positional, input] {
      if (positional->count() == 0 && input->count() == 0)
        throw CLI::RequiredError(fmt::format("{} (or --input FILE)", positional->get_name()));
    });
  }
}

bool layer_options_given(const CLI::App* app) {
  for (const char* name :
       {"--weights", "--heads", "--dk", "--random-weights", "--parameter-free", "--oov", "--positions"})
    if (app->count(name) > 0) return true;
  return false;
}

OovPolicy oov_policy(const SentenceArgs& args) {
  if (args.oov == "zero") return OovPolicy::zero;
  if (args.oov == "skip") return OovPolicy::skip;
  return OovPolicy::error;
}

Embeddings load_embeddings(const SentenceArgs& args) { return Embeddings::load(args.embeddings); }

namespace {

// Each word once, in the order it first occurs, as the error policy lists them.
std::string distinct_list(const std::vector<std::string>& words) {
  std::string list;
  std::set<std::string_view> listed;
  for (const auto& w : words)
    if (listed.insert(w).second) list += (list.empty() ? "" : ", ") + w;
  return list;
}

}  // namespace

void note_missing(const std::vector<std::string>& missing, const SentenceArgs& args, const std::string& what) {
  if (!missing.empty())
    std::fprintf(stderr, "qkv: note: %s: not in %s, %s: %s\n", what.c_str(), args.embeddings.c_str(),
                 oov_policy(args) == OovPolicy::zero ? "given zero vectors" : "skipped",
                 distinct_list(missing).c_str());
}

EmbeddedSentence embed(const Embeddings& embeddings, const std::string& sentence, const SentenceArgs& args,
                       const std::string& what) {
  if (tokenize(sentence).empty())
    throw Error(fmt::format("{}: \"{}\" has no words (it is empty or only punctuation)", what, sentence));
  EmbeddedSentence s;
  try {
    s = embed_sentence(embeddings, sentence, oov_policy(args));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {} (vocabulary: {})", what, e.what(), args.embeddings));
  }
  if (oov_policy(args) == OovPolicy::zero && !s.missing.empty() && s.missing.size() == s.tokens.size())
    // Only zero vectors: every context vector would be zero. Refuse rather than print nothing useful
    // (skip refuses a sentence it leaves empty itself; its tokens are the kept ones only).
    throw Error(fmt::format("{}: none of its words is in {}: {}", what, args.embeddings, distinct_list(s.missing)));
  if (args.positions) add_sinusoidal_positions(s.x.view());
  // A non-finite value in a used vector would turn every context vector into NaN: name the word.
  for (int64_t i = 0; i < s.x.dim(0); ++i)
    for (int64_t j = 0; j < s.x.dim(1); ++j) {
      const float v = s.x.cview()(i, j);
      if (!std::isfinite(v))
        throw Error(fmt::format("{}: the vector of \"{}\" has {} at index {}", args.embeddings,
                                s.tokens[static_cast<std::size_t>(i)], std::isnan(v) ? "NaN" : "Inf", j));
    }
  return s;
}

MultiHeadAttention make_layer(const SentenceArgs& args, int64_t E) {
  if (const std::string weights = layer_file(args); !weights.empty()) {
    MultiHeadAttention layer = MultiHeadAttention::load(weights);
    if (layer.config().embed_dim != E)
      throw Error(fmt::format("--weights {}: the layer takes rows of width E = {}, but the embeddings have width {}",
                              weights, layer.config().embed_dim, E));
    const std::pair<const char*, const Tensor<float>*> tensors[] = {
        {"w_q", &layer.w_q}, {"w_k", &layer.w_k}, {"w_v", &layer.w_v}, {"w_o", &layer.w_o},
        {"b_q", &layer.b_q}, {"b_k", &layer.b_k}, {"b_v", &layer.b_v}, {"b_o", &layer.b_o}};
    for (const auto& [name, t] : tensors)
      if (t->numel() > 0) check_finite(t->cview(), fmt::format("--weights {}: tensor {}", weights, name));
    return layer;
  }
  LayerConfig config;
  config.embed_dim = E;
  config.output_projection = false;
  if (args.parameter_free) {
    config.parameter_free = true;
    return MultiHeadAttention(config);
  }
  if (args.dk == 0 && E % args.heads != 0)
    throw Error(fmt::format("--heads {}: does not divide the embedding width {}; pass --dk", args.heads, E));
  config.num_heads = args.heads;
  config.head_dim = args.dk;
  config.seed = args.seed;
  return MultiHeadAttention(config);
}

namespace {

// A layer file's note as one line a terminal shows as written: its control characters (C0, DEL and
// C1, which carry a terminal's escape sequences and bells) become spaces.
std::string printable_note(std::string_view note) {
  std::string out;
  for (std::size_t i = 0; i < note.size(); ++i) {
    const auto c = static_cast<unsigned char>(note[i]);
    if (c == 0xC2 && i + 1 < note.size() && static_cast<unsigned char>(note[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(note[i + 1]) <= 0x9F) {
      out += ' ';
      ++i;
    } else {
      out += c < 0x20 || c == 0x7F ? ' ' : note[i];
    }
  }
  return out;
}

}  // namespace

std::string describe_layer(const SentenceArgs& args, const MultiHeadAttention& layer) {
  const LayerConfig& c = layer.config();
  if (c.parameter_free) return "parameter-free (Q = K = V = X, seed 002)";
  const int64_t D = c.head_dim > 0 ? c.head_dim : c.embed_dim / c.num_heads;
  const std::string heads = fmt::format("{} head{}, d_k = {}", c.num_heads, c.num_heads == 1 ? "" : "s", D);
  if (const std::string weights = layer_file(args); !weights.empty()) {
    const std::string what = default_layer(args) ? "the trained layer" : "learned weights from";
    return c.note.empty() ? fmt::format("{} {}, {}", what, file_name(weights), heads)
                          : fmt::format("{} {}, {}: {}", what, file_name(weights), heads, printable_note(c.note));
  }
  return fmt::format("random W_q, W_k, W_v (seed {}), {}", c.seed, heads);
}

}  // namespace qkv::cli
