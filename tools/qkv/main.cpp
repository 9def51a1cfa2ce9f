// The `qkv` command: one subcommand per file, registered here. Every failure is one line on
// stderr and a non-zero exit: 2 for bad usage, 1 for bad input or a failed run.
#include <malloc.h>

#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_interrupt.h"
#include "cli_util.h"
#include "commands.h"
#include "qkv/attention_options.h"
#include "qkv/error.h"
#include "qkv/version.h"

namespace {

// glibc gives a freed heap top back to the system past twice its mmap threshold (which follows the
// blocks freed, up to 32 MB), so a loop that allocates and frees MBs per step page-faults them in
// again every step: `qkv train --task lookup` spent a third of its time in memset and the kernel's
// fault path (perf), and 300 steps took 0.60-0.64 s against 0.42-0.43 s with the memory kept (Zen 5
// guest, 1 thread, quiet). The command keeps up to 256 MB of freed memory; one job per process.
void keep_freed_memory() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: a bigger block is still mapped on its own
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

// The command's exit status, unless what it printed could not all reach stdout (/dev/full, a
// closed pipe with SIGPIPE ignored): a report lost is a failed run.
int finish_stdout(int status) {
  try {
    qkv::cli::write_stdout({});  // flushes what is buffered and checks it
    return status;
  } catch (const qkv::Error& e) {
    qkv::cli::print_error(e.what());
    return status == 0 ? 1 : status;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!qkv::cli::open_standard_descriptors()) {
    qkv::cli::print_error(
        "standard output is closed: qkv prints its results there (redirect it to /dev/null to discard them)");
    return 1;
  }
  qkv::cli::install_signal_handlers();
  keep_freed_memory();
  CLI::App app{
      "qkv: self-attention, exact and fast. Try `qkv explain`.\n"
      "\"Seed 000/002/003\" below name the tutorials qkv's worked examples come from: seed 000 \"Playing Outside\"\n"
      "(sample q, k, v vectors), seed 002 (attention from first principles: Q = K = V = X, no parameters) and\n"
      "seed 003 \"How Self-Attention Is Calculated\" (3 words, W_q, W_k, W_v given). `--seed` is a random seed."};
  app.set_version_flag("--version", "qkv " QKV_VERSION);
  app.require_subcommand(1);
  std::vector<qkv::cli::Command> commands;
  for (qkv::cli::CommandFactory add :
       {&qkv::cli::add_explain, &qkv::cli::add_context, &qkv::cli::add_compare, &qkv::cli::add_attend,
        &qkv::cli::add_train, &qkv::cli::add_bench, &qkv::cli::add_serve})
    commands.push_back(add(app));
  if (argc == 1) {
    qkv::cli::print_to_stderr("qkv: no subcommand given; see `qkv --help` (or try `qkv explain`)\n");
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    if (const auto message = qkv::cli::unknown_option_message(app, argc, argv)) {
      qkv::cli::print_to_stderr(fmt::format("qkv: {}\n", *message));
      return 2;
    }
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty()) {
      std::string known;
      for (const CLI::App* sub : app.get_subcommands({})) known += (known.empty() ? "" : ", ") + sub->get_name();
      qkv::cli::print_to_stderr(
          fmt::format("qkv: unknown subcommand '{}' (known: {}; see qkv --help)\n", argv[1], known));
      return 2;
    }
    qkv::cli::print_to_stderr(fmt::format("qkv: {}\n", e.what()));
    return 2;
  } catch (const qkv::Error& e) {  // an option read at parse time (--input FILE) failed
    qkv::cli::print_error(e.what());
    return 1;
  }
  try {  // the library ignores a value it cannot use; a command names it
    qkv::environment_num_threads();
  } catch (const qkv::Error& e) {
    qkv::cli::print_to_stderr(fmt::format("qkv: {}\n", e.what()));
    return 2;
  }
  try {
    for (const auto& command : commands)
      if (command.app->parsed()) return finish_stdout(command.run());
    return 2;
  } catch (const qkv::Error& e) {
    qkv::cli::print_error(e.what());
  } catch (const std::bad_alloc&) {
    qkv::cli::print_error("out of memory");
  } catch (const std::exception& e) {
    qkv::cli::print_error(e.what());
  }
  return 1;
}
