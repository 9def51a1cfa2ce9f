// main() of the bench tools that take arguments (qkv_decode_ab, qkv_attention_ab): an exception
// that leaves `run` (qkv's errors, or memory the machine cannot give) is reported as
// "<name>: <what>" with exit 1; `run` returns 2 itself for a usage error (CLI11). And main() of
// the hand-run ceiling probes, which take no arguments and measure one instruction set.
#pragma once

#include <cstdio>
#include <exception>

#include "qkv/machine.h"

namespace qkv::bench {

inline int tool_main(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

// Exit 2 with a usage line for any argument, 1 with "<name>: <missing>" where the CPU (or OS)
// lacks `isa`, else tool_main's run of `run`.
inline int probe_main(const char* name, PeakIsa isa, const char* missing, int (*run)(int, char**), int argc,
                      char** argv) {
  if (argc > 1) {
    std::fprintf(stderr, "usage: %s (it takes no arguments)\n", name);
    return 2;
  }
  if (!peak_isa_available(isa)) {
    std::fprintf(stderr, "%s: %s\n", name, missing);
    return 1;
  }
  return tool_main(name, run, argc, argv);
}

}  // namespace qkv::bench
