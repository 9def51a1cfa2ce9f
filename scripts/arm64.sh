#!/usr/bin/env bash
# The kernels on 64-bit ARM (`make test` runs it): cross-builds core, kernels, attention, cache
# and qkv_kernel_check with Debian's g++-aarch64-linux-gnu (static, Release, ccache; build-arm64)
# and runs the check under qemu-aarch64 (qemu-user) on the neon and scalar paths: the fused
# forward and backward property cases, the decode, dropout and packed-sequence tests and the long
# sums against the float64 reference, the KV codec's widening loads, every path's exp2, softcap's tanh (NEON's
# vectorized loop against the single call), and bitwise equality for 1, 2, 3 threads.
# Correctness only: qemu emulates the instructions, so its timings say nothing about ARM speed.
# Skips, saying why, when the cross compiler or qemu is missing (`make deps` installs both).
# Environment: JOBS (2), ARM64_BUILD (build-arm64), QKV_ARM64_PROPERTY_CASES (default 200),
# ARM64_FILTER (the gtest filter).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
dir=${ARM64_BUILD:-build-arm64}
cases=${QKV_ARM64_PROPERTY_CASES:-200}
# FusedMemory (N = 65536) and the finite-difference checks are x86-only work at qemu's speed.
filter=${ARM64_FILTER:-Property.*:FusedForward.*:FusedThreads.*:Exp2.*:Softcap.*:Dispatch.*:Backward.*:Decode.*:DecodeMask.*:Dropout.*:Varlen.*:KVCodec.*:MicroKernel.*:LongSums.*:RowLog.*-Backward.ReferenceMatchesFiniteDifferences}

for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  if ! command -v "$tool" >/dev/null; then
    echo "arm64 check SKIPPED: $tool not found (make deps installs g++-aarch64-linux-gnu and qemu-user)"
    exit 0
  fi
done

if [ ! -f "$dir/CMakeCache.txt" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$dir" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
    -DQKV_KERNEL_CHECK=ON "${launcher[@]}" >/dev/null
fi
cmake --build "$dir" -j"$jobs" --target qkv_kernel_check
echo "== arm64: qkv_kernel_check under qemu-aarch64 ($cases property cases; correctness only, no timing)"
QKV_PROPERTY_CASES="$cases" qemu-aarch64 "$dir/qkv_kernel_check" --gtest_brief=1 --gtest_filter="$filter"
