// Option values of the `qkv` subcommands: validators for numbers and comma-separated lists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace qkv::cli {

// Validators for numeric options. CLI11 prefixes the option name; the messages echo the value as
// typed ("'inf' is not a finite number", "'0' is outside 1 to 4096"), never a rendering of the
// bound such as CLI11's own 300-digit DBL_MAX. nonnegative_number / positive_number: a finite
// number >= 0 / > 0; NaN, Inf and values beyond double's range are refused. integer_in: a decimal
// integer in [lo, hi]; any_uint64: a decimal integer in [0, 2^64 - 1] (seeds), a sign refused, not
// wrapped. Both refuse "0x10" and a leading zero ("010"), which CLI11 would read as hex and octal.
CLI::Validator nonnegative_number();
CLI::Validator positive_number();
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator any_uint64();

// Parses "3,5" (option `option`) into integers / numbers (strtod's syntax: "inf" and "1e400" are
// numbers, whose range the option's own rule judges); throws qkv::Error naming the option.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option);
std::vector<double> parse_number_list(const std::string& text, const std::string& option);

// A validator that runs `parse(text, option)` at parse time (a malformed list is a usage error,
// exit 2) and, if count > 0, wants that many entries. The option's prefix is dropped from the
// message: CLI11 adds its own.
template <class F>
CLI::Validator list_check(F parse, const std::string& option, std::size_t count = 0);

// The argument as typed, quoted and cut short: it can be arbitrarily long.
std::string typed(const std::string& text);

// `text` as strtod reads it whole (overflow gives ±inf), or nullopt if it is not a number.
std::optional<double> parse_number(const std::string& text);

}  // namespace qkv::cli
