// One cache-resident block product of the fused kernels for the micro-kernel benchmarks
// (microkernel_bench.cpp: AVX-512, microkernel_avx2_bench.cpp: AVX2): what a family's block
// products reach without the softmax, packing and memory traffic around them, and (fused_D*)
// with the block's online softmax between them. Include only after qkv/tensor.h and kernel_deps.h
// (before the region), a family's ISA region (isa_region.h), its <isa>/ops.h, microkernel.h and
// softmax_columns.h.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>

namespace qkv::bench {
namespace {

// C [64 x ldc] = A · B (alpha null) or alpha ⊙ C + A · B: A's rows and k a_row and a_k floats apart
// (kdim of them), B's rows ldb apart. `add`: C += A · B.
kernels::GemmArgs<float, float> block_args(const float* a, int64_t a_row, int64_t a_k, int64_t kdim, const float* b,
                                           int64_t ldb, float* c, int64_t ldc, const float* alpha = nullptr,
                                           bool add = false) {
  kernels::GemmArgs<float, float> g;
  g.kdim = kdim, g.a = a, g.a_row = a_row, g.a_k = a_k, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc;
  g.alpha = alpha, g.add = add;
  return g;
}

// n floats of x, 64-byte aligned as the kernels' workspaces and qkv's tensors are. A vector's data
// (16 bytes past a page once it is large) made each 64-byte load of B span two cache lines, which
// cost these blocks 10-20 points of the peak on an Intel Xeon (qkv_tile_ceiling_probe).
Tensor<float> floats(int64_t n, float x = 0.0f) {
  Tensor<float> t({n}, "block buffer");
  std::fill(t.data(), t.data() + n, x);
  return t;
}

// scores: Sᵀ [64 keys x 64 lanes] = K [64 x D] · Qᵀ [D x 64]; values: O [64 x 64] = alpha ⊙ O + P · V.
template <class Ops>
void run_block(benchmark::State& state, bool scores, int64_t d) {
  Tensor<float> a = floats(64 * 256, 0.01f), b = floats(256 * 64, 0.02f), c = floats(64 * 64),
                alpha = floats(64, 0.999f);
  // A: rows of K, or P read transposed.
  const kernels::GemmArgs<float, float> g =
      scores ? block_args(a.data(), d, 1, d, b.data(), 64, c.data(), 64)
             : block_args(a.data(), 1, 64, 64, b.data(), 64, c.data(), 64, alpha.data());
  for (auto _ : state) {
    kernels::gemm_blocked<Ops>(g, 64, 64 / Ops::kLanes);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOPS"] =
      benchmark::Counter(2.0 * 64 * 64 * static_cast<double>(g.kdim), benchmark::Counter::kIsIterationInvariantRate);
}

// The online softmax of one block of scores st [nk x 64 lanes] (rows ls apart) whose unscaled
// maxima per lane are block_max: the weights in place, their sum into l, alpha, the new max m.
template <class Ops>
void block_softmax(float* st, int64_t ls, int64_t nk, const float* block_max, typename Ops::V scale, float* m, float* l,
                   float* alpha) {
  using V = typename Ops::V;
  for (int64_t c = 0; c < 64; c += Ops::kLanes) {
    const V m_old = Ops::load(m + c);
    const V m_new = Ops::max(Ops::mul(Ops::load(block_max + c), scale), m_old);
    const V neg_m = Ops::sub(Ops::zero(), m_new);
    V sum = Ops::zero();
    for (int64_t jj = 0; jj < nk; ++jj) {
      const V p = kernels::weight<Ops>(Ops::load(st + jj * ls + c), scale, neg_m);
      Ops::store(st + jj * ls + c, p);
      sum = Ops::add(sum, p);
    }
    const V a = kernels::exp_e<Ops>(Ops::sub(m_old, m_new));
    Ops::store(alpha + c, a);
    Ops::store(l + c, Ops::fma(a, Ops::load(l + c), sum));
    Ops::store(m + c, m_new);
  }
}

// The fused block's softmax alone (block_softmax on Ops::kKeyBlock keys x 64 lanes, in cache, no
// products): the least elementwise work a forward does per score. Counter "scores": scores per
// second. Where the products run far faster than fp32 FMAs (AMX tiles), this, not the products,
// bounds the forward: per score the products are 4·D flops at the tile peak.
template <class Ops>
void run_softmax_block(benchmark::State& state) {
  constexpr int64_t nk = Ops::kKeyBlock;
  const int64_t ls = kernels::column_read_stride(64);
  Tensor<float> st = floats(nk * ls), m = floats(64), l = floats(64), alpha = floats(64), block_max = floats(64, 1.0f);
  for (int64_t i = 0; i < nk * ls; ++i) st[i] = 0.001f * static_cast<float>(i % 997);
  const typename Ops::V scale = Ops::set1(0.125f);
  for (auto _ : state) {
    // The weights overwrite their scores: each pass starts from the same values again, as a
    // kernel's next block brings fresh scores.
    block_softmax<Ops>(st.data(), ls, nk, block_max.data(), scale, m.data(), l.data(), alpha.data());
    std::fill(m.data(), m.data() + 64, 0.0f);
    benchmark::DoNotOptimize(st.data());
  }
  state.counters["scores"] = benchmark::Counter(64.0 * nk, benchmark::Counter::kIsIterationInvariantRate);
}

// The forward's work on one cache-resident block of the fp32 forward's keys on this CPU
// (fp32_block_keys: QKV_KEY_BLOCK, else the CPU's choice) and 64 query lanes, and nothing else:
// Sᵀ = K · Qᵀ into rows as far apart as the kernel's (column_read_stride) with each query row's
// max folded into the product's stores (the deferred scale, as forward_tile.h's interior blocks),
// the weights in place and their sum (softmax_columns.h), alpha, then O = alpha ⊙ O + P · V. No
// packing, transposes, masks or memory traffic: the ceiling of the fp32 forward's blocks at this D
// on this machine. FLOPs: the two products only, as the attention benchmarks count them.
template <class Ops>
void run_fused_block(benchmark::State& state, int64_t d) {
  using V = typename Ops::V;
  constexpr int64_t L = Ops::kLanes;
  const int64_t nk = kernels::fp32_block_keys<Ops>(kernels::fp32_key_block());
  const int64_t ls = kernels::column_read_stride(64);
  Tensor<float> k = floats(nk * d, 0.01f), qt = floats(d * 64, 0.02f), st = floats(nk * ls), v = floats(nk * 64, 0.03f),
                o = floats(64 * 64);
  Tensor<float> m = floats(64), l = floats(64), alpha = floats(64), block_max = floats(64);
  auto scores = block_args(k.data(), d, 1, d, qt.data(), 64, st.data(), ls);
  scores.col_max = block_max.data();
  const auto values = block_args(st.data(), 1, ls, nk, v.data(), 64, o.data(), 64, alpha.data());
  const V scale = Ops::set1(1.0f / std::sqrt(static_cast<float>(d)));
  for (auto _ : state) {
    std::fill(block_max.data(), block_max.data() + 64, -1e30f);
    kernels::gemm_blocked<Ops>(scores, nk, 64 / L);
    block_softmax<Ops>(st.data(), ls, nk, block_max.data(), scale, m.data(), l.data(), alpha.data());
    kernels::gemm_blocked<Ops>(values, 64, 64 / L);
    benchmark::DoNotOptimize(o.data());
  }
  state.counters["FLOPS"] =
      benchmark::Counter(2.0 * 64 * nk * static_cast<double>(d + 64), benchmark::Counter::kIsIterationInvariantRate);
}

// The backward's work on one cache-resident block of 64 keys and 64 query rows (backward_tile.h):
// Sᵀ = K · Qᵀ and dPᵀ = V · dOᵀ, then P = e^(S·scale − lse) and dS = P ⊙ (dP − D) in place, then
// dv += Pᵀ · dO, dk += dSᵀ · Q and dq += dS · K. No packing, transposes, row dots or scratch
// traffic: the ceiling of the fp32 backward at this D. FLOPs: the five products.
template <class Ops>
void run_backward_block(benchmark::State& state, int64_t d) {
  using V = typename Ops::V;
  constexpr int64_t L = Ops::kLanes;
  Tensor<float> k = floats(64 * d, 0.01f), qt = floats(d * 64, 0.02f), q = floats(64 * d, 0.02f),
                v = floats(64 * d, 0.03f), dot = floats(d * 64, 0.01f), dout = floats(64 * d, 0.01f),
                st = floats(64 * 64), dpt = floats(64 * 64), dv = floats(64 * d), dk = floats(64 * d),
                dq = floats(64 * d), lse = floats(64, 1.0f), D = floats(64, 0.5f);
  const auto s = block_args(k.data(), d, 1, d, qt.data(), 64, st.data(), 64);
  const auto dp = block_args(v.data(), d, 1, d, dot.data(), 64, dpt.data(), 64);
  const auto dvs = block_args(st.data(), 64, 1, 64, dout.data(), d, dv.data(), d, nullptr, true);
  const auto dks = block_args(dpt.data(), 64, 1, 64, q.data(), d, dk.data(), d, nullptr, true);
  const auto dqs = block_args(dpt.data(), 1, 64, 64, k.data(), d, dq.data(), d, nullptr, true);
  const V scale = Ops::set1(1.0f / std::sqrt(static_cast<float>(d)));
  for (auto _ : state) {
    kernels::gemm_blocked<Ops>(s, 64, 64 / L);
    kernels::gemm_blocked<Ops>(dp, 64, 64 / L);
    for (int64_t c = 0; c < 64; c += L) {
      const V neg_lse = Ops::sub(Ops::zero(), Ops::load(lse.data() + c)), dd = Ops::load(D.data() + c);
      for (int64_t jj = 0; jj < 64; ++jj) {
        const V p = kernels::weight<Ops>(Ops::load(st.data() + jj * 64 + c), scale, neg_lse);
        Ops::store(st.data() + jj * 64 + c, p);
        Ops::store(dpt.data() + jj * 64 + c, Ops::mul(p, Ops::sub(Ops::load(dpt.data() + jj * 64 + c), dd)));
      }
    }
    for (const auto* g : {&dvs, &dks, &dqs}) kernels::gemm_blocked<Ops>(*g, 64, d / L);
    benchmark::DoNotOptimize(dq.data());
    benchmark::DoNotOptimize(dk.data());
    benchmark::DoNotOptimize(dv.data());
  }
  state.counters["FLOPS"] =
      benchmark::Counter(5 * 2.0 * 64 * 64 * static_cast<double>(d), benchmark::Counter::kIsIterationInvariantRate);
}

// Registers the family's three block products as <prefix>scores_D64, scores_D128 and values, the
// fused forward blocks as fused_D64 and fused_D128 and the backward's as backward_D64, _D128, and
// the forward block's softmax alone as softmax.
template <class Ops>
void register_blocks(const std::string& prefix) {
  benchmark::RegisterBenchmark((prefix + "softmax").c_str(), [](benchmark::State& s) { run_softmax_block<Ops>(s); })
      ->Repetitions(5)
      ->ReportAggregatesOnly(true);
  for (int64_t d : {64, 128})
    benchmark::RegisterBenchmark((prefix + "scores_D" + std::to_string(d)).c_str(),
                                 [d](benchmark::State& s) { run_block<Ops>(s, true, d); })
        ->Repetitions(5)
        ->ReportAggregatesOnly(true);
  benchmark::RegisterBenchmark((prefix + "values").c_str(), [](benchmark::State& s) { run_block<Ops>(s, false, 64); })
      ->Repetitions(5)
      ->ReportAggregatesOnly(true);
  for (int64_t d : {64, 128}) {
    benchmark::RegisterBenchmark((prefix + "fused_D" + std::to_string(d)).c_str(),
                                 [d](benchmark::State& s) { run_fused_block<Ops>(s, d); })
        ->Repetitions(5)
        ->ReportAggregatesOnly(true);
    benchmark::RegisterBenchmark((prefix + "backward_D" + std::to_string(d)).c_str(),
                                 [d](benchmark::State& s) { run_backward_block<Ops>(s, d); })
        ->Repetitions(5)
        ->ReportAggregatesOnly(true);
  }
}

}  // namespace
}  // namespace qkv::bench
