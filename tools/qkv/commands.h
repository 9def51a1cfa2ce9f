// The registry of `qkv` subcommands. Each subcommand lives in its own cmd_<name>.cpp and exposes
// one factory that adds its CLI11 subcommand and returns how to run it.
#pragma once

#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

namespace qkv::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
using CommandFactory = Command (*)(CLI::App&);

Command add_explain(CLI::App& app);
Command add_context(CLI::App& app);
Command add_compare(CLI::App& app);
Command add_attend(CLI::App& app);
Command add_train(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_serve(CLI::App& app);

}  // namespace qkv::cli
