// How close can the bf16 forward's key block come to the AMX-BF16 tile peak on this core? A probe
// for the bf16 rows' ceiling, built by `make bench` as build/bench/qkv_amx_block_probe, run by
// hand (docs/benchmarks.md). One thread runs one tile's key block at the shape of S3 and S4 (64
// query rows, 128 keys, head dims 64) with the kernel's own pieces, on buffers that stay in L1
// and L2 between runs:
//   scores:  Sᵀ [128 x 64] = K · Qᵀ on AMX tiles (AmxBf16::gemm, 64 tile products);
//   softmax: each query's block max and weights, written as bf16 pairs (column_max,
//            weights_to_pairs: 8192 exponentials);
//   values:  Oᵀ [64 x 64] = Vᵀ · Pᵀ on AMX tiles (64 tile products), folded into O;
// each alone; the softmax beside a single tile product per block (16 x 16 x 16: it shows what
// the tile unit's work costs the vector work near it); the three in series as the kernel runs
// them; and pipelined: the next block's scores in four strips of 32 keys, each followed by the
// softmax of one vector of queries of the block before (two score buffers), the shape of a kernel
// that overlaps its tile products with its exponentials. It prints the microseconds per block
// (best of 5 runs of 20,000 blocks) and the products' rate as a % of the AMX peak measured in the
// same process: where "in series" and "pipelined" stay under a row's target, no bf16 forward
// built from these pieces reaches it on this core.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>

#include "isa_region.h"
#include "kernels/kernel_deps.h"
#include "qkv/machine.h"
#include "qkv/tensor.h"
#include "tool_main.h"

QKV_ISA_REGION_BEGIN("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,amx-tile,amx-bf16")

#include "kernels/avx512/ops.h"
#include "kernels/microkernel.h"
#include "kernels/large_scores.h"
#include "kernels/softmax_columns.h"
#include "kernels/value_block.h"

namespace {

using Ops = qkv::kernels::Avx512;
using V = Ops::V;
constexpr int64_t kKeys = Ops::kKeyBlock, kRows = 64, kD = 64, kPairs = kD / 2;
constexpr int64_t kLs = qkv::kernels::column_read_stride(kRows);  // the scores' row stride, as the kernel's
constexpr double kFlops = 2.0 * 2.0 * kKeys * kRows * kD;         // both products

// One tile's buffers, 64-byte aligned as the kernel's workspace.
struct Block {
  qkv::Tensor<uint32_t> k{{kKeys * kPairs}, "probe K"}, qt{{kPairs * kRows}, "probe Q"};
  qkv::Tensor<uint32_t> vrows{{kD * kKeys / 2}, "probe V"}, pairs{{kKeys / 2 * kRows}, "probe P"};
  qkv::Tensor<float> st{{2 * kKeys * kLs}, "probe scores"}, o{{kD * kRows}, "probe O"}, pv{{kD * kRows}, "probe PV"};
  float m[kRows], l[kRows], alpha[kRows];
  Block() {
    // bf16 pairs of small values, so the scores and weights stay ordinary numbers.
    std::fill(k.data(), k.data() + k.numel(), 0x3c003c00u);  // (2^-7, 2^-7)
    std::fill(qt.data(), qt.data() + qt.numel(), 0x3f803f80u);
    std::fill(vrows.data(), vrows.data() + vrows.numel(), 0x3f803f80u);
    std::fill(o.data(), o.data() + o.numel(), 0.0f);
    std::fill(m, m + kRows, 0.0f);
    std::fill(l, l + kRows, 0.0f);
  }
  float* scores(int which) { return st.data() + which * kKeys * kLs; }

  // Sᵀ for the keys [k0, k0 + keys) into score buffer `which`.
  void score_keys(int which, int64_t k0, int64_t keys) {
    Ops::TileDot::gemm(k.data() + k0 * kPairs, kPairs * 4, qt.data(), kRows, scores(which) + k0 * kLs, kLs, keys, kRows,
                       kPairs, false);
  }
  // The online softmax of query vector g of buffer `which`, its weights as pairs.
  void softmax(int which, int64_t g) {
    const float* s = scores(which) + g * Ops::kLanes;
    const V m_old = Ops::load(m + g * Ops::kLanes), scale = Ops::set1(0.125f);
    const V mx = Ops::max(Ops::mul(qkv::kernels::column_max<Ops>(s, kLs, kKeys, Ops::set1(-1e30f)), scale), m_old);
    const V neg_m = Ops::sub(Ops::zero(), mx);
    const V sum = qkv::kernels::weights_to_pairs<Ops, Ops::PairDot>(s, kLs, kKeys, scale, neg_m,
                                                                    pairs.data() + g * Ops::kLanes, kRows);
    const V a = qkv::kernels::weight<Ops>(m_old, Ops::set1(1.0f), neg_m);
    Ops::store(alpha + g * Ops::kLanes, a);
    Ops::store(l + g * Ops::kLanes, Ops::fma(a, Ops::load(l + g * Ops::kLanes), sum));
    Ops::store(m + g * Ops::kLanes, mx);
  }
  // Oᵀ = alpha ⊙ Oᵀ + Vᵀ · Pᵀ.
  void values() {
    Ops::TileDot::gemm(vrows.data(), kKeys / 2 * 4, pairs.data(), kRows, pv.data(), kRows, kD, kRows, kKeys / 2, false);
    qkv::kernels::fold_block_transposed<Ops>(o.data(), pv.data(), alpha, kRows, kD, kRows);
  }
};

enum class Diet { scores, softmax, softmax_beside_tiles, values, series, pipelined };

void one_block(Block& b, Diet diet, int64_t n) {
  constexpr int64_t kVecs = kRows / Ops::kLanes, kStrip = kKeys / kVecs;
  switch (diet) {
    case Diet::scores:
      b.score_keys(0, 0, kKeys);
      break;
    case Diet::softmax:
      for (int64_t g = 0; g < kVecs; ++g) b.softmax(0, g);
      break;
    case Diet::softmax_beside_tiles:
      Ops::TileDot::gemm(b.k.data(), kPairs * 4, b.qt.data(), kRows, b.pv.data(), kRows, 16, 16, 16, false);
      for (int64_t g = 0; g < kVecs; ++g) b.softmax(0, g);
      break;
    case Diet::values:
      b.values();
      break;
    case Diet::series:
      b.score_keys(0, 0, kKeys);
      for (int64_t g = 0; g < kVecs; ++g) b.softmax(0, g);
      b.values();
      break;
    case Diet::pipelined: {  // block n's scores beside block n - 1's softmax
      const int now = static_cast<int>(n & 1);
      for (int64_t g = 0; g < kVecs; ++g) {
        b.score_keys(now, g * kStrip, kStrip);
        b.softmax(1 - now, g);
      }
      b.values();
      break;
    }
  }
}

// Seconds per block: the best of 5 runs of 20,000 blocks (15-90 ms each).
double best_time(Block& b, Diet diet) {
  constexpr int64_t kBlocks = 20'000;
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t n = 0; n < kBlocks; ++n) one_block(b, diet, n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kBlocks);
  }
  return best;
}

// probe_main has checked the arguments and the CPU.
int run(int, char**) {
  const double peak = qkv::measure_peak(1, qkv::PeakIsa::amx_bf16, 5, 0.2).best;
  Block b;
  Ops::TileDot::begin();
  std::printf("bf16 forward key block on AMX tiles: %lld queries x %lld keys, head dims %lld, 1 thread;\n",
              static_cast<long long>(kRows), static_cast<long long>(kKeys), static_cast<long long>(kD));
  std::printf("AMX-BF16 tile peak %.1f GFLOP/s; each line's products (%.2f MFLOP for both) against it\n", peak / 1e9,
              kFlops / 1e6);
  // flops: the products the line's work holds (none for the softmax alone).
  const auto line = [&](const char* diet, double seconds, double flops) {
    std::printf("  %-44s %7.3f us", diet, seconds * 1e6);
    if (flops > 0) std::printf("  %5.1f%% of the peak", 100 * flops / seconds / peak);
    std::printf("\n");
  };
  const double scores = best_time(b, Diet::scores), softmax = best_time(b, Diet::softmax);
  const double values = best_time(b, Diet::values);
  line("scores alone", scores, kFlops / 2);
  line("softmax alone", softmax, 0);
  line("softmax beside one tile product", best_time(b, Diet::softmax_beside_tiles), 0);
  line("values and fold alone", values, kFlops / 2);
  line("the three times added", scores + softmax + values, kFlops);
  line("in series (the kernel's order)", best_time(b, Diet::series), kFlops);
  line("pipelined (scores beside the last softmax)", best_time(b, Diet::pipelined), kFlops);
  Ops::TileDot::end();
  return 0;
}

}  // namespace

QKV_ISA_REGION_END

int main(int argc, char** argv) {
  return qkv::bench::probe_main("qkv_amx_block_probe", qkv::PeakIsa::amx_bf16,
                                "this CPU or OS gives no AMX-BF16 tiles (or QKV_AMX=0)", run, argc, argv);
}
