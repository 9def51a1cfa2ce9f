// What does a page size cost a decode step? D1's layer (B = 1, H = 32, Hkv = 8, D = 128, one
// query) stepped cold (streamed from memory, bench/decode_caches.h) in pages of 16-256 tokens and
// in a contiguous cache (one page), per storage dtype, context length and thread count; the
// layouts alternate round by round, so a slow phase of a shared machine hits each alike, and each
// figure is the median of the rounds: wall time, and CPU time per thread (process CPU seconds /
// threads, which other jobs' load does not lengthen; run with OMP_WAIT_POLICY=passive so idle
// threads do not spin it up). This is the measurement the cache's default page size
// (KVCacheConfig::page_tokens) is chosen by.
//   build/bench/qkv_decode_page_sweep [--shuffled] [--rounds R] [--dtypes f32,f16,i8]
//                                     [--tokens 4096,16384,32768] [--pages 16,32,64,128,256]
// --shuffled takes the pages from the pool in a random order, as after many sequences came and went.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "qkv/machine_info.h"
#include "decode_caches.h"

namespace qkv::bench {
namespace {

std::vector<int64_t> int_list(const char* text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

std::string load() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct Layout {
  int64_t page_tokens;  // == M: contiguous
  std::vector<Setup> layers;
  std::vector<PagedKV> kv;
};

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct StepTime {
  double wall, cpu;  // seconds per step; cpu: per thread
};

// Seconds per step over `steps` steps, each on the next layer (cold).
StepTime time_steps(const Layout& l, int threads, int steps, std::vector<float>& q, std::vector<float>& out) {
  DecodeOptions o;
  o.attention.num_threads = threads;
  o.attention.mask.causal = CausalAlign::bottom_right;
  const TensorView<const float> qv(q.data(), {1, kH, 1, kD});
  const TensorView<float> ov(out.data(), {1, kH, 1, kD});
  std::size_t next = 0;
  const double cpu = process_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    decode_attention(ov, TensorView<float>(), qv, l.kv[next], o);
    next = next + 1 == l.kv.size() ? 0 : next + 1;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {wall / steps, (process_cpu_seconds() - cpu) / threads / steps};
}

int run(int argc, char** argv) {
  bool shuffled = false;
  int rounds = 7;
  std::vector<std::string> dtypes{"f32", "f16", "i8"};
  std::vector<int64_t> tokens{4096, 16384, 32768}, pages{16, 32, 64, 128, 256};
  for (int i = 1; i < argc; ++i) {
    const bool more = i + 1 < argc;
    if (std::strcmp(argv[i], "--shuffled") == 0) {
      shuffled = true;
    } else if (std::strcmp(argv[i], "--rounds") == 0 && more) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--dtypes") == 0 && more) {
      dtypes.clear();
      std::stringstream in(argv[++i]);
      std::string d;
      while (std::getline(in, d, ',')) dtypes.push_back(d);
    } else if (std::strcmp(argv[i], "--tokens") == 0 && more) {
      tokens = int_list(argv[++i]);
    } else if (std::strcmp(argv[i], "--pages") == 0 && more) {
      pages = int_list(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--shuffled] [--rounds R] [--dtypes f32,f16,i8] [--tokens M,...] [--pages P,...]\n",
                   argv[0]);
      return 2;
    }
  }
  const MachineInfo& m = machine_info();
  std::printf("decode step vs page size: D1 (B1 H32 Hkv8 D128), cold, %s pages; %s (%s), default page %lld tokens\n",
              shuffled ? "shuffled" : "in-order", m.class_name.c_str(), m.brand.c_str(),
              static_cast<long long>(KVCacheConfig{}.page_tokens));
  std::printf(
      "load before: %s; median of %d rounds, us per step, wall and CPU per thread (%% slower than contiguous)\n\n",
      load().c_str(), rounds);
  std::printf("| dtype | M | thr | time |");
  for (int64_t p : pages) std::printf(" %lld |", static_cast<long long>(p));
  std::printf(" contiguous |\n|---|---|---|---|");
  for (std::size_t i = 0; i <= pages.size(); ++i) std::printf("---|");
  std::printf("\n");
  std::vector<float> q(kH * kD), out(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 37) % 17) / 17.0f - 0.5f;
  for (const std::string& name : dtypes) {
    KVDtype dtype = KVDtype::f32;
    for (KVDtype d : {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8})
      if (name == kv_dtype_name(d)) dtype = d;
    for (int64_t M : tokens) {
      std::vector<Layout> layouts;
      for (int64_t p : pages) layouts.push_back({p, {}, {}});
      layouts.push_back({M, {}, {}});
      for (Layout& l : layouts) {
        const int count = cold_layers(dtype, {M}, l.page_tokens);
        for (int layer = 0; layer < count; ++layer) {
          l.layers.push_back(make_cache(dtype, {M}, l.page_tokens, shuffled && l.page_tokens < M, layer));
          l.kv.push_back(l.layers.back().cache->paged(l.layers.back().ids));
        }
      }
      // At least 2 passes over the layers per sample, and about 40 ms of steps.
      const int steps = std::max(2 * static_cast<int>(layouts[0].kv.size()),
                                 static_cast<int>(0.04 * 40e9 / layouts[0].layers[0].step_bytes));
      for (int threads : {1, 2}) {
        std::vector<std::vector<double>> t(layouts.size()), c(layouts.size());
        for (Layout& l : layouts) time_steps(l, threads, static_cast<int>(l.kv.size()), q, out);  // warm-up
        for (int r = 0; r < rounds; ++r)
          for (std::size_t i = 0; i < layouts.size(); ++i) {
            const std::size_t k = (i + r) % layouts.size();  // a different layout first each round
            const StepTime st = time_steps(layouts[k], threads, steps, q, out);
            t[k].push_back(st.wall);
            c[k].push_back(st.cpu);
          }
        for (const auto& [label, times] : {std::pair{"wall", &t}, std::pair{"CPU", &c}}) {
          const double contiguous = median(times->back());
          std::printf("| %s | %lldk | %d | %s |", name.c_str(), static_cast<long long>(M / 1024), threads, label);
          for (std::size_t k = 0; k + 1 < layouts.size(); ++k) {
            const double x = median((*times)[k]);
            std::printf(" %.0f (%+.0f%%) |", x * 1e6, 100 * (x / contiguous - 1));
          }
          std::printf(" %.0f |\n", contiguous * 1e6);
        }
        std::fflush(stdout);
      }
    }
  }
  std::printf("\nload after: %s\n", load().c_str());
  return 0;
}

}  // namespace
}  // namespace qkv::bench

int main(int argc, char** argv) { return qkv::bench::run(argc, argv); }
