// Ring attention benchmark (bench/ring_bench.sh runs it and prints the ratios). Modes:
//   mpirun -np P ring_bench ring [--threads T]   ring forward/backward on S4 and S6, plain and causal
//   ring_bench single [--threads T]              the same shapes with the single-process fused kernel
//   mpirun -np 2 ring_bench bandwidth            loopback MPI bandwidth (ping-pong, 64 MB messages)
//   ring_bench kernel                            1-thread fused forward/backward GFLOP/s on one ring block
//   mpirun -np P ring_bench memory N D           ring forward on N tokens with a 128-token window:
//                                                peak RSS per rank, to show it is O(N/P·D)
// Times are medians of --reps runs after one warm-up; rank 0 prints one line per measurement.
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qkv/backward.h"
#include "qkv/distributed.h"

namespace {

using qkv::Tensor;

struct Shape {
  const char* name;
  int64_t B, H, N, D;
};
constexpr Shape kShapes[] = {{"S4", 1, 8, 4096, 64}, {"S6", 1, 1, 16384, 128}};

int g_rank = 0, g_ranks = 1, g_threads = 1, g_reps = 3;

Tensor<float> random(std::initializer_list<int64_t> shape, uint64_t seed) {
  Tensor<float> t(shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist;
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = dist(rng);
  return t;
}

// User + system CPU seconds of this process (all its threads).
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Timing {
  double wall = 0;  // median wall seconds
  double cpu = 0;   // median CPU seconds summed over the ranks (MPI waiting spins, so it counts)
};

template <class F>
Timing median_seconds(F&& f) {
  std::vector<double> wall, cpu;
  for (int i = 0; i <= g_reps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    const double cpu0 = cpu_seconds();
    f();
    double used = cpu_seconds() - cpu0, total = 0;
    MPI_Allreduce(&used, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (i > 0) {
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      cpu.push_back(total);
    }
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

void report(const char* mode, const Shape& s, bool causal, const char* pass, Timing t) {
  const double flops = (pass[0] == 'f' ? 4.0 : 10.0) * s.B * s.H * double(s.N) * s.N * s.D / (causal ? 2 : 1);
  if (g_rank == 0)
    std::printf("%s %s %s %s P=%d threads=%d seconds=%.4f cpu=%.4f gflops=%.1f cpu_gflops_per_core=%.1f\n", mode,
                s.name, causal ? "causal" : "plain", pass, g_ranks, g_threads, t.wall, t.cpu, flops / t.wall * 1e-9,
                flops / t.cpu * 1e-9);
}

// One shape on P ranks (P = 1 and mode single: the plain fused kernel on the whole sequence).
void run_shape(const Shape& s, bool causal, bool ring) {
  const int64_t n = ring ? qkv::shard_length(s.N, g_ranks, g_rank, qkv::Sharding::zigzag) : s.N;
  const uint64_t seed = 1000 + g_rank;
  Tensor<float> q = random({s.B, s.H, n, s.D}, seed), k = random({s.B, s.H, n, s.D}, seed + 1);
  Tensor<float> v = random({s.B, s.H, n, s.D}, seed + 2), dout = random({s.B, s.H, n, s.D}, seed + 3);
  Tensor<float> out({s.B, s.H, n, s.D}), lse({s.B, s.H, n}), dq(q.shape()), dk(k.shape()), dv(v.shape());
  qkv::RingOptions o;
  o.attention.num_threads = g_threads;
  if (causal) o.attention.mask.causal = qkv::CausalAlign::top_left;
  auto forward = [&] {
    if (ring)
      qkv::ring_attention_forward(MPI_COMM_WORLD, out.view(), lse.view(), q.cview(), k.cview(), v.cview(), o);
    else
      qkv::attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), o.attention);
  };
  auto backward = [&] {
    if (ring)
      qkv::ring_attention_backward(MPI_COMM_WORLD, dq.view(), dk.view(), dv.view(), dout.cview(), q.cview(), k.cview(),
                                   v.cview(), out.cview(), lse.cview(), o);
    else
      qkv::attention_backward(dq.view(), dk.view(), dv.view(), {}, dout.cview(), q.cview(), k.cview(), v.cview(),
                              out.cview(), lse.cview(), o.attention);
  };
  const char* mode = ring ? "ring" : "single";
  report(mode, s, causal, "forward", median_seconds(forward));
  report(mode, s, causal, "backward", median_seconds(backward));
}

void bandwidth() {
  const int64_t count = 16 << 20;  // 64 MB of floats
  std::vector<float> buf(count, 1.0f);
  const double seconds = median_seconds([&] {
                           if (g_rank == 0) {
                             MPI_Send(buf.data(), count, MPI_FLOAT, 1, 0, MPI_COMM_WORLD);
                             MPI_Recv(buf.data(), count, MPI_FLOAT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                           } else if (g_rank == 1) {
                             MPI_Recv(buf.data(), count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                             MPI_Send(buf.data(), count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD);
                           }
                         }).wall;
  if (g_rank == 0) std::printf("bandwidth bytes=%ld GB/s=%.2f\n", long(count * 4), 2.0 * count * 4 / seconds * 1e-9);
}

// The kernel on one block as a ring step sees it: n = 2048 queries and keys, D = 128, 1 thread.
void kernel_speed() {
  const Shape block{"block", 1, 1, 2048, 128};
  run_shape(block, false, false);
}

void memory(int64_t N, int64_t D) {
  const int64_t n = qkv::shard_length(N, g_ranks, g_rank, qkv::Sharding::zigzag);
  Tensor<float> q = random({1, 1, n, D}, g_rank), out({1, 1, n, D}), lse({1, 1, n});
  qkv::RingOptions o;
  o.attention.num_threads = g_threads;
  o.attention.mask.causal = qkv::CausalAlign::top_left;
  o.attention.mask.window = qkv::Window{128, 0};
  const auto start = std::chrono::steady_clock::now();
  qkv::ring_attention_forward(MPI_COMM_WORLD, out.view(), lse.view(), q.cview(), q.cview(), q.cview(), o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  long rss = usage.ru_maxrss, max_rss = 0;
  MPI_Reduce(&rss, &max_rss, 1, MPI_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf("memory N=%ld D=%ld P=%d shard_tokens=%ld shard_q_MB=%.1f max_rss_MB=%.1f seconds=%.2f\n", long(N),
                long(D), g_ranks, long(n), n * D * 4 / 1e6, max_rss / 1024.0, seconds);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_ranks);
  const std::string mode = argc > 1 ? argv[1] : "ring";
  std::vector<std::string> rest(argv + std::min(argc, 2), argv + argc);
  for (std::size_t i = 0; i + 1 < rest.size(); ++i) {
    if (rest[i] == "--threads") g_threads = std::atoi(rest[i + 1].c_str());
    if (rest[i] == "--reps") g_reps = std::atoi(rest[i + 1].c_str());
  }
  if (mode == "ring" || mode == "single") {
    const char* only = std::getenv("RING_BENCH_SHAPE");
    for (const Shape& s : kShapes)
      for (bool causal : {false, true})
        if (only == nullptr || std::strcmp(only, s.name) == 0) run_shape(s, causal, mode == "ring");
  } else if (mode == "bandwidth") {
    bandwidth();
  } else if (mode == "kernel") {
    kernel_speed();
  } else if (mode == "memory" && argc >= 4) {
    memory(std::atol(argv[2]), std::atol(argv[3]));
  } else {
    if (g_rank == 0) std::fprintf(stderr, "usage: ring_bench ring|single|bandwidth|kernel|memory N D [--threads T]\n");
    MPI_Finalize();
    return 2;
  }
  MPI_Finalize();
  return 0;
}
