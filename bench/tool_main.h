// main() of the bench tools that take arguments (qkv_decode_ab, qkv_attention_ab): an exception
// that leaves `run` (qkv's errors, or memory the machine cannot give) is reported as
// "<name>: <what>" with exit 1; `run` returns 2 itself for a usage error (CLI11).
#pragma once

#include <cstdio>
#include <exception>

namespace qkv::bench {

inline int tool_main(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace qkv::bench
