// A region of a source compiled for an instruction set beyond the build's baseline, for the
// micro-kernel benchmarks, which put one family's kernels into the qkv_bench binary that runs
// (and checks the CPU) everywhere. Library headers (the standard library's, Google Benchmark's)
// go before the region, so no inline copy of theirs is compiled for the wider set. GCC marks the
// functions defined in the region with `#pragma GCC target`; clang ignores that pragma and takes
// `#pragma clang attribute` instead, as Highway does.
#pragma once

#define QKV_ISA_PRAGMA(x) _Pragma(#x)

#if defined(__clang__)
#define QKV_ISA_REGION_BEGIN(isa) \
  QKV_ISA_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define QKV_ISA_REGION_END QKV_ISA_PRAGMA(clang attribute pop)
#else
// GCC 12 flags the deliberately undefined pass-through operand of the AVX-512 shuffles, as in the
// kernels' own sources (src/kernels/CMakeLists.txt).
#define QKV_ISA_REGION_BEGIN(isa)                                \
  QKV_ISA_PRAGMA(GCC push_options)                               \
  QKV_ISA_PRAGMA(GCC diagnostic push)                            \
  QKV_ISA_PRAGMA(GCC diagnostic ignored "-Wmaybe-uninitialized") \
  QKV_ISA_PRAGMA(GCC diagnostic ignored "-Wuninitialized")       \
  QKV_ISA_PRAGMA(GCC target(isa))
#define QKV_ISA_REGION_END           \
  QKV_ISA_PRAGMA(GCC diagnostic pop) \
  QKV_ISA_PRAGMA(GCC pop_options)
#endif
