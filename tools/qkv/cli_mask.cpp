// The mask options of `qkv attend`. Each value's rule is the core's (qkv/options_parse.h), run at
// parse time so a bad value is a usage error (exit 2) with the message Python gives.
#include "cli_mask.h"

#include <fmt/format.h>

#include "cli_util.h"
#include "cli_values.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/options_parse.h"

namespace qkv::cli {
namespace {

// A validator running a core rule on the typed text. CLI11 prefixes the option's name, so a
// message that starts with it ("--alibi-slopes: '0.5,,1' has an empty entry") drops its own.
template <class Rule>
CLI::Validator core_rule(Rule rule, const std::string& form) {
  return CLI::Validator(
      [rule](std::string& text) -> std::string {
        try {
          rule(text);
          return {};
        } catch (const Error& e) {
          std::string message = e.what();
          const std::size_t colon = message.find(": ");
          if (message.rfind("--", 0) == 0 && colon != std::string::npos) message.erase(0, colon + 2);
          return message;
        }
      },
      form, "");
}

double number_or_refuse(const std::string& text) {
  const std::optional<double> v = parse_number(text);
  if (!v) throw Error(typed(text) + " is not a number");
  return *v;
}

std::vector<float> alibi_slopes(const std::string& text) {
  const std::vector<double> typed_slopes = parse_number_list(text, "--alibi-slopes");
  std::vector<float> slopes;
  for (std::size_t i = 0; i < typed_slopes.size(); ++i) slopes.push_back(alibi_slope_value(typed_slopes[i], i));
  return slopes;
}

}  // namespace

void add_mask_options(CLI::App* app, MaskArgs& args) {
  const CLI::Validator align = core_rule([](const std::string& t) { parse_causal_align(t); }, "ALIGN");
  // A flag that also takes "=value": --causal alone is top_left (PyTorch's is_causal).
  app->add_flag("--causal{top_left}", args.causal,
                "Causal mask; --causal=bottom_right puts the diagonal at the last valid key (decoding with a cache)")
      ->check(align);
  app->add_option("--diagonal", args.diagonal,
                  "Where the --window and ALiBi diagonal sits without --causal: top_left (default) or bottom_right")
      ->check(align);
  app->add_option("--window", args.window, "Sliding window L,R around the diagonal (negative = unbounded)")
      ->check(list_check(parse_int_list, "--window", 2));
  app->add_option("--key-lengths", args.key_lengths, "Valid keys per batch row, e.g. 3,5")
      ->check(list_check(parse_int_list, "--key-lengths"));
  app->add_option("--query-lengths", args.query_lengths, "Valid queries per batch row, e.g. 2,4")
      ->check(list_check(parse_int_list, "--query-lengths"));
  app->add_option("--keep-mask", args.keep_mask_path, "Bool .npy broadcastable to [B,H,N,M]; true = may attend");
  app->add_option("--bias", args.bias_path, "Additive float .npy broadcastable to [B,H,N,M]; -inf removes a pair");
  app->add_option("--alibi-slopes", args.alibi_slopes, "ALiBi slopes, one per query head: s1,s2,...")
      ->check(core_rule([](const std::string& t) { alibi_slopes(t); }, "LIST"));
  app->add_option("--softcap", args.softcap, "Logit softcap C: s -> C*tanh(s/C) before bias and ALiBi (0 = off)")
      ->check(core_rule([](const std::string& t) { softcap_value(number_or_refuse(t)); }, "NONNEGATIVE"));
}

Mask build_mask(MaskArgs& args, int64_t B, int64_t H, int64_t N, int64_t M) {
  Mask mask;
  if (!args.causal.empty()) mask.causal = parse_causal_align(args.causal);
  mask.diagonal = parse_causal_align(args.diagonal);
  if (!args.window.empty()) {
    const std::vector<int64_t> lr = parse_int_list(args.window, "--window");
    if (lr.size() != 2) throw Error(fmt::format("--window: expected L,R (two integers), got '{}'", args.window));
    mask.window = Window{lr[0], lr[1]};
  }
  if (!args.key_lengths.empty()) mask.key_lengths = parse_int_list(args.key_lengths, "--key-lengths");
  if (!args.query_lengths.empty()) mask.query_lengths = parse_int_list(args.query_lengths, "--query-lengths");
  if (!args.alibi_slopes.empty()) mask.alibi_slopes = alibi_slopes(args.alibi_slopes);
  mask.softcap = softcap_value(args.softcap);
  if (!args.keep_mask_path.empty()) {
    const std::string name = "--keep-mask " + args.keep_mask_path;
    args.keep = load_npy<uint8_t>(args.keep_mask_path);
    if (args.keep.rank() == 0) throw Error(name + ": a scalar cannot be a mask; expected [.., N, M]");
    mask.keep = broadcast_mask(args.keep.cview(), B, H, N, M, name.c_str());
  }
  if (!args.bias_path.empty()) {
    const std::string name = "--bias " + args.bias_path;
    args.bias = load_npy<float>(args.bias_path);
    if (args.bias.rank() == 0) throw Error(name + ": a scalar cannot be a bias; expected [.., N, M]");
    check_finite(args.bias.cview(), args.bias_path, /*allow_neg_inf=*/true);
    mask.bias = broadcast_mask(args.bias.cview(), B, H, N, M, name.c_str());
  }
  return mask;
}

}  // namespace qkv::cli
