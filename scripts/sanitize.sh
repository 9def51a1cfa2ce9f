#!/usr/bin/env bash
# Sanitizer runs of the C++ tests (`make sanitize`, part of `make test`):
#   asan  every C++ test built with AddressSanitizer + UndefinedBehaviorSanitizer (clang-14), any
#         report fatal (-fno-sanitize-recover=all, halt_on_error), in build-asan, the tree the
#         fuzzers use too (scripts/asan_tree.sh).
#   tsan  the threaded tests (fused forward, bf16, backward and decode kernels, their determinism tests, the
#         property tests, the parallel embedding reader) under ThreadSanitizer, built with clang-14
#         and LLVM's libomp, with the Archer OMPT tool loaded so TSan sees OpenMP's
#         synchronization (libgomp under TSan gives false reports), in build-tsan. Only the test
#         files those suites live in are built (qkv_thread_tests; tests/CMakeLists.txt holds the
#         file list and the filter, written to <tree>/tests/thread_tests.filter).
# Usage: scripts/sanitize.sh [asan|tsan|all]. Environment: JOBS (2), ASAN_BUILD, TSAN_BUILD,
# QKV_SANITIZE_PROPERTY_CASES (property cases under a sanitizer; default 100), TSAN_FILTER.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
jobs=${JOBS:-2}
cases=${QKV_SANITIZE_PROPERTY_CASES:-100}
. scripts/asan_tree.sh

run_asan() {
  local dir=${ASAN_BUILD:-build-asan}
  configure_asan_tree "$dir"
  cmake --build "$dir" -j"$jobs" --target qkv_tests
  echo "== ASan + UBSan: all C++ tests ($dir)"
  # allocator_may_return_null: the 2 TB limit tests need malloc's null, not ASan's abort.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1:check_initialization_order=1 \
    LSAN_OPTIONS=suppressions="$PWD/scripts/lsan.supp" UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 QKV_PROPERTY_CASES="$cases" \
    QKV_TEST_DATA="$PWD/tests/data" "$dir/tests/qkv_tests" --gtest_brief=1
}

run_tsan() {
  local dir=${TSAN_BUILD:-build-tsan}
  local archer=/usr/lib/llvm-14/lib/libarcher.so
  [ -f "$archer" ] || { echo "missing $archer (install libomp-14-dev)" >&2; exit 1; }
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S . -B "$dir" -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=Sanitize -DQKV_SANITIZE=thread \
      -DQKV_PYTHON=OFF -DQKV_BUILD_BENCH=OFF -DQKV_BUILD_TOOLS=OFF >/dev/null
  fi
  cmake --build "$dir" -j"$jobs" --target qkv_thread_tests
  local filter=${TSAN_FILTER:-$(cat "$dir/tests/thread_tests.filter")}
  echo "== TSan + Archer: $filter ($dir)"
  local log
  log=$(mktemp)
  local status=0
  OMP_TOOL_LIBRARIES="$archer" ARCHER_OPTIONS=verbose=1 TSAN_OPTIONS="halt_on_error=1 exitcode=66 ignore_noninstrumented_modules=1" \
    QKV_PROPERTY_CASES="$cases" QKV_NUM_THREADS=4 "$dir/tests/qkv_thread_tests" --gtest_brief=1 --gtest_filter="$filter" \
    >"$log" 2>&1 || status=$?
  cat "$log"
  # Without Archer every OpenMP barrier looks like a race; make sure it was really loaded.
  if ! grep -q "Archer detected OpenMP application with TSan" "$log"; then
    echo "TSan run: the Archer tool did not load (OMP_TOOL_LIBRARIES=$archer)" >&2
    status=1
  fi
  if grep -q "WARNING: ThreadSanitizer" "$log"; then status=1; fi
  rm -f "$log"
  return "$status"
}

case "$what" in
  asan) run_asan ;;
  tsan) run_tsan ;;
  all) run_asan && run_tsan ;;
  *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;;
esac
