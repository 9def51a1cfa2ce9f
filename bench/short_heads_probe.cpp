// What do short heads (issue 16's S2: 8·12·128·64) reach when every head's inputs sit in L2? A
// probe for issue 16 item 2, not part of the build; it links the library `make build` leaves:
//   g++ -O2 -std=c++20 -Iinclude -o /tmp/short_heads_probe bench/short_heads_probe.cpp build/libqkv.a \
//     -fopenmp -lopenblas -lfmt && OMP_WAIT_POLICY=passive /tmp/short_heads_probe [threads]
// S2's forward and backward through the public API, twice: "distinct", the benchmark's layout
// (96 heads, 3 MB per tensor, from L3 or memory at each head's start), and "in L2", q, k, v (and
// dout) given batch and head strides of 0, so all 96 heads read one head's 96 KB, which stays in
// L2 (outputs stay distinct). The rest of the work is the same: tiles, packing, softmax, masks,
// lse, dk/dv sums. So "in L2" is S2's rate without the inputs' first touch: the ceiling that
// scheduling or prefetching across heads could reach. Rounds alternate; each figure is the
// median of 15 calls, in GFLOP/s and % of the FMA peak measured by this binary just before.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "qkv/attention.h"
#include "qkv/backward.h"
#include "qkv/machine.h"

namespace {

constexpr int64_t B = 8, H = 12, N = 128, D = 64;

struct Inputs {
  std::vector<float> q, k, v, dout;
};
struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

double median_rate(const Inputs& in, Outputs& io, bool in_l2, bool backward, int threads) {
  const int64_t shape[4] = {B, H, N, D};
  const int64_t distinct[4] = {H * N * D, N * D, D, 1}, shared[4] = {0, 0, D, 1};
  const std::span<const int64_t> st(in_l2 ? shared : distinct, 4), sh(shape, 4);
  const qkv::TensorView<const float> q(in.q.data(), sh, st), k(in.k.data(), sh, st), v(in.v.data(), sh, st),
      dout(in.dout.data(), sh, st);
  const qkv::TensorView<float> out(io.out.data(), sh), lse(io.lse.data(), {B, H, N});
  qkv::AttentionOptions options;
  options.num_threads = threads;
  qkv::attention_forward(out, lse, q, k, v, options);  // out and lse for the backward
  std::vector<double> seconds;
  for (int r = 0; r < 15; ++r) {
    const auto start = std::chrono::steady_clock::now();
    if (backward)
      qkv::attention_backward(qkv::TensorView<float>(io.dq.data(), sh), qkv::TensorView<float>(io.dk.data(), sh),
                              qkv::TensorView<float>(io.dv.data(), sh), {}, dout, q, k, v, out, lse, options);
    else
      qkv::attention_forward(out, lse, q, k, v, options);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return (backward ? 10.0 : 4.0) * B * H * N * N * D / seconds[seconds.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const std::size_t n = B * H * N * D;
  Inputs in;
  Outputs io;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (auto* t : {&in.q, &in.k, &in.v, &in.dout}) {
    t->resize(n);
    for (float& x : *t) x = normal(rng);
  }
  for (auto* t : {&io.out, &io.dq, &io.dk, &io.dv}) t->resize(n);
  io.lse.resize(B * H * N);
  const qkv::PeakIsa isa = qkv::peak_isa_available(qkv::PeakIsa::avx512) ? qkv::PeakIsa::avx512 : qkv::PeakIsa::avx2;
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    const double flops = qkv::fma_peak_work(threads, 20'000'000, isa);
    const double peak = flops / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("threads %d, FMA peak %.1f GFLOP/s:", threads, peak / 1e9);
    for (bool backward : {false, true})
      for (bool in_l2 : {false, true}) {
        const double rate = median_rate(in, io, in_l2, backward, threads);
        std::printf("  %s %s %.1f (%.0f%%)", backward ? "backward" : "forward", in_l2 ? "in L2" : "distinct",
                    rate / 1e9, 100 * rate / peak);
      }
    std::printf("\n");
  }
}
