// How close can the fused kernels' register tile come to the FMA peak on this core, with the loads
// it needs and no more? A probe for the block products' ceiling, built by `make bench` as
// build/bench/qkv_tile_ceiling_probe (AVX-512), run by hand (docs/benchmarks.md).
// One thread runs the AVX-512 micro-tile's arithmetic (Avx512::kRows x kVecs accumulators, one
// FMA each per k step) in four diets: from registers alone; with the kVecs vector loads of B's
// row per k step; with the kRows broadcasts of A's column; with both, as the micro-kernel
// (microkernel.h) does. Operands come from a 64 KiB L1/L2-resident buffer, 64-byte aligned as the
// kernels' are. It prints each diet's GFLOP/s (best of 5 runs of about 0.1 s) and its % of the
// machine's FMA peak measured in the same process (measure_peak, 16 chains from registers): where
// the last diet stays under a row's target, no block of the fp32 kernels can reach it on this core.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include "isa_region.h"
#include "kernels/kernel_deps.h"
#include "qkv/machine.h"
#include "qkv/tensor.h"
#include "tool_main.h"

QKV_ISA_REGION_BEGIN("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")

#include "kernels/avx512/ops.h"

namespace {

using Ops = qkv::kernels::Avx512;
using V = Ops::V;
constexpr int kR = Ops::kRows, kNV = Ops::kVecs, kL = Ops::kLanes;
constexpr int64_t kBufferFloats = 16 * 1024;  // 64 KiB
constexpr int64_t kRowFloats = 64;            // B's rows one k step apart, and A's columns

// Loads and Bcasts: whether each k step reads B's row and A's column from memory, or reuses
// values already in registers. Returns a sum so the chains stay live.
template <bool Loads, bool Bcasts>
__attribute__((noinline)) float tile_steps(const float* buf, int64_t steps) {
  V acc[kR][kNV];
#pragma GCC unroll 8
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < kNV; ++v) acc[r][v] = Ops::set1(0.001f * static_cast<float>(r * kNV + v));
  // As in the micro-kernel, one register holds A's value for the row at hand: kR of them beside
  // the accumulators and B's kNV would not fit in the 32 registers (GCC spilled accumulators).
  V b[kNV];
#pragma GCC unroll 8
  for (int v = 0; v < kNV; ++v) b[v] = Ops::set1(0.5f + 0.01f * static_cast<float>(v));
  const V a_kept = Ops::set1(0.25f);
  // B's rows walk the first half of the buffer, kRowFloats apart; A is kR rows kRowFloats apart in
  // the second half, read down one column per k step, as the kernel reads K's rows.
  const float* p = buf;
  const float* const wrap = buf + kBufferFloats / 2 - kRowFloats;
  const float* const a_rows = buf + kBufferFloats / 2;
  for (int64_t s = 0; s < steps; ++s) {
    if constexpr (Loads) {
#pragma GCC unroll 8
      for (int v = 0; v < kNV; ++v) b[v] = Ops::load(p + v * kL);
    }
#pragma GCC unroll 8
    for (int r = 0; r < kR; ++r) {
      const V a = Bcasts ? Ops::set1(a_rows[r * kRowFloats + (s & (kRowFloats - 1))]) : a_kept;
#pragma GCC unroll 8
      for (int v = 0; v < kNV; ++v) acc[r][v] = Ops::fma(a, b[v], acc[r][v]);
    }
    p = p == wrap ? buf : p + kRowFloats;
  }
  V t = Ops::zero();
#pragma GCC unroll 8
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < kNV; ++v) t = Ops::add(t, acc[r][v]);
  float lanes[kL];
  Ops::store(lanes, t);
  return lanes[0] + lanes[kL - 1];
}

template <bool Loads, bool Bcasts>
double best_rate(const qkv::Tensor<float>& buf) {
  constexpr int64_t kSteps = 20'000'000;  // about 0.1 s at the peak (12 cycles a step at 2 FMAs per cycle)
  volatile float sink = 0;
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    sink = sink + tile_steps<Loads, Bcasts>(buf.data(), kSteps);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * kR * kNV * kL * static_cast<double>(kSteps) / seconds);
  }
  return best;
}

// probe_main has checked the arguments and the CPU.
int run(int, char**) {
  // 64-byte aligned, as the kernels' buffers: a vector's 16-byte alignment split every other 64-byte
  // load across two cache lines, which read 71-73% of the peak where aligned loads read 85%
  // (Intel Xeon with AMX).
  qkv::Tensor<float> buf({kBufferFloats}, "probe buffer");
  std::fill(buf.data(), buf.data() + kBufferFloats, 0.01f);
  const double peak = qkv::measure_peak(1, qkv::PeakIsa::avx512, 5, 0.2).best;
  std::printf("AVX-512 micro-tile %d x %d (%d FMAs, %d vector loads, %d broadcasts per k step), 1 thread;\n", kR, kNV,
              kR * kNV, kNV, kR);
  std::printf("fp32 FMA peak (16 chains from registers) %.1f GFLOP/s\n", peak / 1e9);
  const auto line = [&](const char* diet, double rate) {
    std::printf("  %-34s %7.1f GFLOP/s  %5.1f%% of the peak\n", diet, rate / 1e9, 100 * rate / peak);
  };
  line("registers only", best_rate<false, false>(buf));
  line("with B's vector loads", best_rate<true, false>(buf));
  line("with A's broadcasts", best_rate<false, true>(buf));
  line("with both (the micro-kernel's diet)", best_rate<true, true>(buf));
  return 0;
}

}  // namespace

QKV_ISA_REGION_END

int main(int argc, char** argv) {
  return qkv::bench::probe_main("qkv_tile_ceiling_probe", qkv::PeakIsa::avx512, "this CPU has no AVX-512", run, argc,
                                argv);
}
