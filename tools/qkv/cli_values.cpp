// Option values of the `qkv` subcommands: numbers and comma-separated lists as typed.
#include "cli_values.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include "qkv/error.h"

namespace qkv::cli {

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

// Integers are decimal digits only. CLI11 converts with base 0 after the validators, where "010"
// is 8 and "0x10" is 16, which nobody typing a step count, a seed or a length means: a hex prefix
// is not an integer here, and a leading zero is refused rather than read as octal (a check cannot
// rewrite the text CLI11 converts). The lists take the same rule.
std::optional<std::string> leading_zero(const std::string& text) {
  const std::size_t first = text.find_first_not_of(" \t\n\v\f\r+-");
  if (first == std::string::npos || text[first] != '0' || first + 1 >= text.size()) return std::nullopt;
  return fmt::format("{} has a leading zero (not read as octal): write it without", typed(text));
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
    if (const std::optional<std::string> zero = leading_zero(p))
      throw Error(fmt::format("{}: {} (in '{}')", option, *zero, text));
    values.push_back(v);
  }
  return values;
}

std::vector<double> parse_number_list(const std::string& text, const std::string& option) {
  std::vector<double> values;
  for (const std::string& p : split_commas(text, option)) {
    char* end = nullptr;
    const double v = std::strtod(p.c_str(), &end);
    if (end == p.c_str() || *end != '\0')
      throw Error(fmt::format("{}: '{}' is not a number (in '{}')", option, p, text));
    values.push_back(v);
  }
  return values;
}

// Runs `parse` at parse time, so a malformed list is a usage error (exit 2), not a failed run.
template <class F>
CLI::Validator list_check(F parse, const std::string& option, std::size_t count) {
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
template CLI::Validator list_check(std::vector<int64_t> (*)(const std::string&, const std::string&), const std::string&,
                                   std::size_t);
template CLI::Validator list_check(std::vector<double> (*)(const std::string&, const std::string&), const std::string&,
                                   std::size_t);

std::string typed(const std::string& text) {
  return text.size() <= 40 ? "'" + text + "'" : "'" + text.substr(0, 40) + "...'";
}

std::optional<double> parse_number(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) return std::nullopt;
  return v;
}

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
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end != text.c_str() + text.size())
          return fmt::format("{} is not an integer (expected {})", typed(text), range);
        if (errno == ERANGE && unbounded) return typed(text) + " is beyond the 64-bit integer range";
        if (errno == ERANGE || v < lo || v > hi)
          return fmt::format("{} {} {}", typed(text), unbounded ? "must be" : "is outside", range);
        return leading_zero(text).value_or("");
      },
      unbounded ? fmt::format("INT >= {}", lo) : fmt::format("INT in [{} - {}]", lo, hi), "");
}

CLI::Validator any_uint64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        constexpr const char* range = "0 to 2^64 - 1";
        const std::size_t first = text.find_first_not_of(" \t\n\v\f\r");
        char* end = nullptr;
        errno = 0;
        (void)std::strtoull(text.c_str(), &end, 10);
        if (text.empty() || end != text.c_str() + text.size())
          return fmt::format("{} is not an integer (expected {})", typed(text), range);
        // strtoull takes "-1" as 2^64 - 1: a sign is refused here, not wrapped.
        if (errno == ERANGE || (first != std::string::npos && text[first] == '-'))
          return fmt::format("{} is outside {}", typed(text), range);
        return leading_zero(text).value_or("");
      },
      "UINT in [0 - 2^64-1]", "");
}

}  // namespace qkv::cli
