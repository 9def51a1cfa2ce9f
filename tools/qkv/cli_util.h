// Helpers shared by the `qkv` subcommands: the layer/embedding options of the sentence commands, finiteness checks that
// name the tensor and index, and output files that are either all written or none.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_values.h"

#include "qkv/attention.h"
#include "qkv/embeddings.h"
#include "qkv/layer.h"
#include "qkv/output_file.h"
#include "qkv/tensor.h"

namespace qkv::cli {

// For a command line CLI11 refused: "unknown option --head (did you mean --heads?)" if an argument
// starting with "--" is not an option of the subcommand (or of qkv itself); nullopt otherwise.
std::optional<std::string> unknown_option_message(const CLI::App& app, int argc, char** argv);

// Throws CLI::ValidationError (exit code 2, "usage") with `message`; for checks that CLI11
// cannot express, run from a subcommand's parse callback.
[[noreturn]] void usage_error(const std::string& message);
// Writes `text` to stderr and flushes. A stderr that is closed or full loses the text, and never
// turns the command's outcome into an abort (fmt::print would throw, inside a catch).
void print_to_stderr(std::string_view text) noexcept;
// "qkv: error: <message>" on stderr, flushed: the one form every failure is reported in.
void print_error(std::string_view message);

// Refuses NaN and Inf (or only NaN and +Inf when `allow_neg_inf`, for additive biases) with
// "<name>: element [i, j, ...] is NaN", the index in the tensor's own shape, or the one
// `to_file_index` makes of it (a rank's shard of a file names the element's place in the file).
using IndexMap = std::function<void(std::vector<int64_t>& index)>;
template <class T>
void check_finite(TensorView<const T> t, const std::string& name, bool allow_neg_inf = false,
                  const IndexMap& to_file_index = {});

// Checks that `path` (given to `option`) can be written by the rule of qkv/output_file.h and
// returns where it leads; throws qkv::Error "<option> <path>: <why>" otherwise. Cheap, run before
// computing.
OutputTarget check_output_path(const std::string& path, const std::string& option);
// check_output_path for each (option, path) whose path is not empty, then that no two of them
// lead to one file, however spelled ("./x", "d/../x", a link, a hard link): throws qkv::Error
// "<option> <path>: named for two outputs (<option> <path> is the same file)", or "(and for
// <option>)", otherwise. Nor may an output be one of the files the command reads (`inputs`, each
// (option, path); "" and "-" skipped), however spelled: "<option> <path>: the same file as <input
// option> <path>, which this command reads; ...". Writing over it would lose the input to a slip
// of the keyboard, as `gcc -o x.c x.c` would.
void check_output_paths(const std::vector<std::pair<std::string, std::string>>& outputs,
                        const std::vector<std::pair<std::string, std::string>>& inputs = {});

// Adds `check` to what runs when `app`'s parsing completes, after the checks added before it
// (CLI11 keeps only one parse-complete callback per app; two features both need one).
void on_parse_complete(CLI::App* app, std::function<void()> check);

// Writes `bytes` to standard output and flushes, throwing qkv::Error if either fails (a closed
// pipe or a full disk must not end in exit code 0).
void write_stdout(std::string_view bytes);

// Writes every (path, bytes) by write_files_atomically (qkv/atomic_file.h): a failure replaces no
// file, so a failed run leaves every output as it was. The files must differ (checked, as
// check_output_paths compares them).
void write_outputs(const std::vector<std::pair<std::string, std::string>>& files);

// Embeddings and the layer for the sentence commands (explain, context, compare).
struct SentenceArgs {
  std::string embeddings;
  std::string oov = "error";
  std::string weights;  // safetensors from MultiHeadAttention::save
  int64_t heads = 1;
  int64_t dk = 0;  // 0: E / heads
  uint64_t seed = 0;
  bool random = false;  // --random-weights, --heads or --dk: a random layer, on request only
  bool parameter_free = false;
  bool positions = false;  // add sinusoidal positional encodings to X (qkv/positions.h)
};
// Registers --embeddings (resolved by resolve_default_embeddings if `embeddings_required`), --oov,
// --weights, --random-weights, --heads, --dk, --parameter-free, --positions. Without a layer option
// the trained layer is used (layer_file).
void add_sentence_options(CLI::App* app, SentenceArgs& args, bool embeddings_required);
// The path of the data file `name` (words.txt, context-layer.safetensors) that the command uses by
// default, or "" if none exists. Searched in order: $QKV_DATA_DIR (if set and not empty), the
// directory of the running executable + "/data" (a build tree: build/qkv reads build/data/), and
// that directory + "/../share/qkv" (an installed prefix, the .deb, the pip package). No path of
// the build machine is compiled in. data_search_path() is that list, for messages and --help.
std::string find_data_file(std::string_view name);
std::string data_search_path();
// Fills args.embeddings when --embeddings was not given: $QKV_EMBEDDINGS, else
// find_data_file("words.txt"); otherwise a usage error saying how to get one. QKV_EMBEDDINGS set
// but empty disables the default. The rule, for --help: default_embeddings_rule().
void resolve_default_embeddings(SentenceArgs& args);
// The file name of the trained layer `make demo` builds beside the word vectors.
inline constexpr const char* kDefaultLayerName = "context-layer.safetensors";
// The layer file the sentence commands use: --weights, else (no layer option) the trained layer
// beside the default word vectors, which only goes with those vectors; "" for a random or
// parameter-free layer. Throws qkv::Error, saying how to get one, when the trained layer is absent
// or the word vectors are not the ones it was trained on.
std::string layer_file(const SentenceArgs& args);
// The files a sentence command reads, labelled for check_output_paths' message: the word vectors
// and the layer (none for a random or parameter-free layer, or one layer_file cannot find, which
// make_layer then reports).
std::vector<std::pair<std::string, std::string>> sentence_inputs(const SentenceArgs& args);
// No layer option given: the trained layer is used.
inline bool default_layer(const SentenceArgs& args) {
  return args.weights.empty() && !args.random && !args.parameter_free;
}
std::string default_embeddings_rule();
// The last component of `path`: what pages and headers show, so no page embeds where the user's
// files live.
std::string file_name(const std::string& path);
// Lets the sentence(s) of `positional` (stored in `sentence`, or in `sentences` for two) also come
// from `--input FILE` (whole file; two non-blank lines for two sentences) or standard input ("-"
// as --input's file or as the positional itself), e.g. sentences beyond the command-line length
// limit. A required positional stays required unless --input is given.
void add_sentence_input(CLI::App* app, CLI::Option* positional, std::vector<std::string>* sentences,
                        std::string* sentence);
// True if any layer option (--weights, --heads, --dk, --seed, --parameter-free, --oov) was given.
bool layer_options_given(const CLI::App* app);
OovPolicy oov_policy(const SentenceArgs& args);
// Loads the embeddings and refuses non-finite vectors only when they are used (see embed()).
Embeddings load_embeddings(const SentenceArgs& args);
// Tokenizes and embeds `sentence` (named `what` in messages). Prints nothing: a command notes the
// zeroed or skipped words with note_missing; `qkv serve` answers with them.
EmbeddedSentence embed(const Embeddings& embeddings, const std::string& sentence, const SentenceArgs& args,
                       const std::string& what = "sentence");
// "qkv: note: <what>: not in <vocabulary>, given zero vectors|skipped: <words>" on stderr, each
// missing word once in the order it first occurs; nothing when none is missing.
void note_missing(const std::vector<std::string>& missing, const SentenceArgs& args,
                  const std::string& what = "sentence");
// The layer: loaded from --weights (checked against width E and for finite weights), or a fresh
// seeded one (no output projection, so its output is the heads' context vectors), or parameter-free.
MultiHeadAttention make_layer(const SentenceArgs& args, int64_t E);
// A one-line description of the layer for headers ("random W (seed 0), 1 head, d_k = 50").
std::string describe_layer(const SentenceArgs& args, const MultiHeadAttention& layer);

}  // namespace qkv::cli
