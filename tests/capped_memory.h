// Death-test helper for the "a declared size is refused before allocating" tests (limits_test.cpp,
// io_memory_test.cpp): the load runs in a child whose address space is capped, so a loader that
// did allocate the declared size fails there instead of exhausting the shared machine.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "qkv/error.h"
#include "sanitizers.h"

namespace qkv::test {

// The child of EXPECT_EXIT: caps its address space at `cap` bytes (not under ASan, whose shadow
// memory cannot run capped), runs `load`, prints the Error and exits 0, or exits 3 if the load
// succeeded. The child re-ran the test body (threadsafe death tests re-execute the binary) and so
// made its own copy of the file at `path`; it removes it.
[[noreturn]] inline void load_with_capped_memory(const std::function<void()>& load, uint64_t cap,
                                                 const std::string& path) {
#ifndef QKV_TEST_UNDER_ASAN
  const rlimit limit{cap, cap};
  ::setrlimit(RLIMIT_AS, &limit);
#else
  (void)cap;
#endif
  int code = 3;
  try {
    load();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    code = 0;
  }
  std::remove(path.c_str());
  std::exit(code);
}

}  // namespace qkv::test
