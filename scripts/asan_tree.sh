# Sourced by scripts/sanitize.sh and scripts/fuzz.sh: configures the one ASan + UBSan tree both use
# (build-asan). clang-14, because libFuzzer needs it; the library and tests are instrumented for
# coverage too (-fsanitize=fuzzer-no-link, fuzz/CMakeLists.txt), so the fuzzers link the same
# library objects the tests do instead of a second tree compiling the library again.
configure_asan_tree() {
  local dir=$1
  [ -f "$dir/CMakeCache.txt" ] && return 0
  cmake -S . -B "$dir" -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=Sanitize \
    -DQKV_SANITIZE=address,undefined -DQKV_FUZZ=ON -DQKV_FUZZ_SANITIZERS=address,undefined \
    -DQKV_PYTHON=OFF -DQKV_BUILD_BENCH=OFF -DQKV_BUILD_TOOLS=OFF -DQKV_MPI=OFF -DQKV_INSTALL=OFF >/dev/null
}
