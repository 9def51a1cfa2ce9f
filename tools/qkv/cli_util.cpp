// Shared CLI helpers: finiteness checks, option lists, mask options and all-or-nothing outputs.
#include "cli_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <memory>
#include <map>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/output_file.h"

namespace qkv::cli {

void usage_error(const std::string& message) { throw CLI::ValidationError(message); }

void print_error(std::string_view message) {
  fmt::print(stderr, "qkv: error: {}\n", message);
  std::fflush(stderr);
}

template <class T>
void check_finite(TensorView<const T> t, const std::string& name, bool allow_neg_inf, const IndexMap& to_file_index) {
  // Loaded tensors are contiguous: scan them in place; copy only strided views.
  Tensor<T> copy;
  const T* data = t.data();
  if (!t.is_contiguous()) {
    copy = to_contiguous<T>(t);
    data = copy.data();
  }
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const T x = data[i];
    if (std::isfinite(x) || (allow_neg_inf && std::isinf(x) && x < 0)) continue;
    std::vector<int64_t> index(static_cast<std::size_t>(t.rank()));
    int64_t rest = i;
    for (int d = t.rank() - 1; d >= 0; --d) {
      index[static_cast<std::size_t>(d)] = rest % t.dim(d);
      rest /= t.dim(d);
    }
    if (to_file_index) to_file_index(index);
    const char* what = std::isnan(x) ? "NaN" : (x > 0 ? "+Inf" : "-Inf");
    throw Error(fmt::format("{}: element {} is {}", name, shape_string(index), what));
  }
}
template void check_finite<float>(TensorView<const float>, const std::string&, bool, const IndexMap&);
template void check_finite<double>(TensorView<const double>, const std::string&, bool, const IndexMap&);

namespace {

std::vector<std::string> split_commas(const std::string& text, const std::string& option) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (const auto& p : parts)
    if (p.empty()) throw Error(fmt::format("{}: '{}' has an empty entry (expected e.g. 3,5)", option, text));
  return parts;
}

}  // namespace

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option) {
  std::vector<int64_t> values;
  for (const std::string& p : split_commas(text, option)) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(p.c_str(), &end, 10);
    if (end == p.c_str() || *end != '\0' || errno == ERANGE)
      throw Error(fmt::format("{}: '{}' is not an integer (in '{}')", option, p, text));
    values.push_back(v);
  }
  return values;
}

std::vector<float> parse_float_list(const std::string& text, const std::string& option) {
  std::vector<float> values;
  for (const std::string& p : split_commas(text, option)) {
    char* end = nullptr;
    const float v = std::strtof(p.c_str(), &end);
    if (end == p.c_str() || *end != '\0' || !std::isfinite(v))
      throw Error(fmt::format("{}: '{}' is not a finite number (in '{}')", option, p, text));
    values.push_back(v);
  }
  return values;
}

namespace {

// Runs `parse` at parse time, so a malformed list is a usage error (exit 2), not a failed run.
template <class F>
CLI::Validator list_check(F parse, const std::string& option, std::size_t count = 0) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        try {
          const std::size_t n = parse(text, option).size();
          if (count != 0 && n != count) return fmt::format("expected {} comma-separated values, got '{}'", count, text);
          return {};
        } catch (const Error& e) {
          // CLI11 names the option itself; drop ours.
          std::string message = e.what();
          if (message.rfind(option + ": ", 0) == 0) message.erase(0, option.size() + 2);
          return message;
        }
      },
      "LIST", "");
}

// The argument as typed, quoted and cut short: it can be arbitrarily long.
std::string typed(const std::string& text) {
  return text.size() <= 40 ? "'" + text + "'" : "'" + text.substr(0, 40) + "...'";
}

}  // namespace

namespace {

CLI::Validator finite_number(bool positive) {
  return CLI::Validator(
      [positive](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) return typed(text) + " is not a number";
        // ERANGE with a large result is overflow (1e400); an underflow to 0 or a subnormal is a number.
        if (!std::isfinite(v) || (errno == ERANGE && std::fabs(v) > 1)) return typed(text) + " is not a finite number";
        if (positive ? !(v > 0) : !(v >= 0)) return typed(text) + (positive ? " must be > 0" : " must be >= 0");
        return {};
      },
      positive ? "POSITIVE" : "NONNEGATIVE", "");
}

}  // namespace

CLI::Validator nonnegative_number() { return finite_number(false); }
CLI::Validator positive_number() { return finite_number(true); }

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const bool unbounded = hi == std::numeric_limits<int64_t>::max();
  const std::string range = unbounded ? fmt::format(">= {}", lo) : fmt::format("{} to {}", lo, hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(text.c_str(), &end, 0);
        if (text.empty() || end != text.c_str() + text.size())
          return fmt::format("{} is not an integer (expected {})", typed(text), range);
        if (errno == ERANGE && unbounded) return typed(text) + " is beyond the 64-bit integer range";
        if (errno == ERANGE || v < lo || v > hi)
          return fmt::format("{} {} {}", typed(text), unbounded ? "must be" : "is outside", range);
        return {};
      },
      unbounded ? fmt::format("INT >= {}", lo) : fmt::format("INT in [{} - {}]", lo, hi), "");
}

void add_mask_options(CLI::App* app, MaskArgs& args) {
  // A flag that also takes "=value": --causal alone is top_left (PyTorch's is_causal).
  app->add_flag("--causal{top_left}", args.causal,
                "Causal mask; --causal=bottom_right puts the diagonal at the last valid key (decoding with a cache)")
      ->check(CLI::IsMember({"top_left", "bottom_right"}));
  app->add_option("--diagonal", args.diagonal,
                  "Where the --window and ALiBi diagonal sits without --causal: top_left (default) or bottom_right")
      ->check(CLI::IsMember({"top_left", "bottom_right"}));
  app->add_option("--window", args.window, "Sliding window L,R around the diagonal (negative = unbounded)")
      ->check(list_check(parse_int_list, "--window", 2));
  app->add_option("--key-lengths", args.key_lengths, "Valid keys per batch row, e.g. 3,5")
      ->check(list_check(parse_int_list, "--key-lengths"));
  app->add_option("--query-lengths", args.query_lengths, "Valid queries per batch row, e.g. 2,4")
      ->check(list_check(parse_int_list, "--query-lengths"));
  app->add_option("--keep-mask", args.keep_mask_path, "Bool .npy broadcastable to [B,H,N,M]; true = may attend");
  app->add_option("--bias", args.bias_path, "Additive float .npy broadcastable to [B,H,N,M]; -inf removes a pair");
  app->add_option("--alibi-slopes", args.alibi_slopes, "ALiBi slopes, one per query head: s1,s2,...")
      ->check(list_check(parse_float_list, "--alibi-slopes"));
  app->add_option("--softcap", args.softcap, "Logit softcap C: s -> C*tanh(s/C) before bias and ALiBi (0 = off)")
      ->check(nonnegative_number());
}

Mask build_mask(MaskArgs& args, int64_t B, int64_t H, int64_t N, int64_t M) {
  Mask mask;
  if (!args.causal.empty())
    mask.causal = args.causal == "bottom_right" ? CausalAlign::bottom_right : CausalAlign::top_left;
  mask.diagonal = args.diagonal == "bottom_right" ? CausalAlign::bottom_right : CausalAlign::top_left;
  if (!args.window.empty()) {
    const std::vector<int64_t> lr = parse_int_list(args.window, "--window");
    if (lr.size() != 2) throw Error(fmt::format("--window: expected L,R (two integers), got '{}'", args.window));
    mask.window = Window{lr[0], lr[1]};
  }
  if (!args.key_lengths.empty()) mask.key_lengths = parse_int_list(args.key_lengths, "--key-lengths");
  if (!args.query_lengths.empty()) mask.query_lengths = parse_int_list(args.query_lengths, "--query-lengths");
  if (!args.alibi_slopes.empty()) mask.alibi_slopes = parse_float_list(args.alibi_slopes, "--alibi-slopes");
  if (!std::isfinite(args.softcap) || args.softcap < 0)
    throw Error(fmt::format("--softcap: {} must be finite and >= 0 (0 = off)", args.softcap));
  mask.softcap = static_cast<float>(args.softcap);
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

void check_output_path(const std::string& path, const std::string& option) {
  try {
    (void)resolve_output(path);
  } catch (const Error& e) {
    // "cannot write X: why" -> "--out X: why", the option being what the user typed.
    std::string message = e.what();
    const std::string prefix = "cannot write ";
    if (message.rfind(prefix, 0) == 0)
      message.replace(0, prefix.size(), option + " ");
    else
      message = option + ": " + message;
    throw Error(message);
  }
}

void write_outputs(const std::vector<std::pair<std::string, std::string>>& files) {
  std::set<std::string> seen;
  for (const auto& f : files)
    if (!seen.insert(f.first).second) throw Error(fmt::format("{}: named for two outputs", f.first));
  std::vector<OutputTarget> targets;
  for (const auto& f : files) targets.push_back(resolve_output(f.first));
  // Only files this call wrote are removed on failure; a device or stdout is never ours to remove.
  std::vector<std::string> written;
  try {
    for (std::size_t i = 0; i < files.size(); ++i) {
      write_output(files[i].first, targets[i], files[i].second);
      if (targets[i].kind == OutputKind::file) written.push_back(targets[i].resolved);
    }
  } catch (...) {
    for (const std::string& path : written) std::remove(path.c_str());
    throw;
  }
}

void write_stdout(std::string_view bytes) {
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) throw Error("cannot write to standard output");
}

void on_parse_complete(CLI::App* app, std::function<void()> check) {
  static std::map<CLI::App*, std::shared_ptr<std::vector<std::function<void()>>>> checks;
  std::shared_ptr<std::vector<std::function<void()>>>& list = checks[app];
  if (!list) {
    list = std::make_shared<std::vector<std::function<void()>>>();
    app->parse_complete_callback([all = list] {
      for (const std::function<void()>& f : *all) f();
    });
  }
  list->push_back(std::move(check));
}

}  // namespace qkv::cli
