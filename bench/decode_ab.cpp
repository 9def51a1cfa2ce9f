// Is a change to the decode kernel faster? This binary's own build of qkv (A) against another
// build's shared library (B: e.g. build/libqkv.so.0.3 copied aside before the change), both in this
// one process. B is loaded with dlopen(RTLD_DEEPBIND), so that its calls stay inside its own copy of
// the library, and both step the same caches (D1's layer, bench/decode_caches.h, for one sequence or
// a batch of equal ones), A and B in turn,
// the first of the two alternating round by round. B must be built from the same public headers
// (PagedKV and DecodeOptions as this build lays them out): its kernel may differ, its API may not.
// A process draws how its caches lie in memory and keeps that for its life: on a Zen 5 guest,
// eight runs of one binary in a row took 5.0 ms per int8 step (D1, M = 32768) three times and
// 6.6 ms five times. An A/B of whole processes (farm-bench, bench/ab_compare.sh) can put all of
// one mode on one side; here both sides share it.
//   build/bench/qkv_decode_ab LIB_B [--rounds R] [--dtypes f16,i8] [--tokens 1024,32768]
//                                   [--threads 1,2] [--batch 8] [--hot]
// Cold (the default) cycles through enough copies of each cache that a step streams it from memory;
// --hot steps one copy, left in the caches by the step before. Prints per case the medians over
// rounds of A's and B's wall time per step, the median of the rounds' ratios B / A, and whether
// the two builds' outputs of one step have the same bits.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "qkv/error.h"
#include "qkv/machine_info.h"
#include "decode_caches.h"
#include "tool_main.h"

namespace qkv::bench {
namespace {

// decode_attention(out, lse, q, const PagedKV&, const DecodeOptions&), the overload both builds step.
using DecodeFn = void (*)(TensorView<float>, TensorView<float>, TensorView<const float>, const PagedKV&,
                          const DecodeOptions&);
// Its symbol in the other build (the Itanium C++ ABI's name, as GCC and Clang mangle it).
constexpr const char* kDecodeSymbol =
    "_ZN3qkv16decode_attentionENS_10TensorViewIfEES1_NS0_IKfEERKNS_7PagedKVERKNS_13DecodeOptionsE";

// One step of `f` on the query q (batch x kH x kD) against kv, into out (the same shape).
void step(DecodeFn f, const PagedKV& kv, int threads, const std::vector<float>& q, std::vector<float>& out) {
  DecodeOptions o;
  o.attention.num_threads = threads;
  o.attention.mask.causal = CausalAlign::bottom_right;
  const int64_t batch = static_cast<int64_t>(q.size()) / (kH * kD);
  f(TensorView<float>(out.data(), {batch, kH, 1, kD}), TensorView<float>(),
    TensorView<const float>(q.data(), {batch, kH, 1, kD}), kv, o);
}

// Seconds per step, median of `steps` steps, each on the next copy of the cache.
double step_time(DecodeFn f, const std::vector<PagedKV>& kv, int threads, const std::vector<float>& q,
                 std::vector<float>& out, int steps) {
  std::vector<double> t;
  for (int s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    step(f, kv[static_cast<std::size_t>(s) % kv.size()], threads, q, out);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median(t);
}

// Whether a and b give the same bits on one step: for a change that must not move any.
bool same_bits(DecodeFn a, DecodeFn b, const PagedKV& kv, int threads, const std::vector<float>& q) {
  std::vector<float> oa(q.size()), ob(q.size());
  step(a, kv, threads, q, oa);
  step(b, kv, threads, q, ob);
  return std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)) == 0;
}

int run(int argc, char** argv) {
  CLI::App app("Decode steps of this build (A) against another build's libqkv (B), in one process.");
  std::string lib_b;
  int rounds = 11;
  bool hot = false;
  std::vector<std::string> dtype_names{"f16", "i8"};
  std::vector<int64_t> tokens{32768}, threads{1};
  int64_t batch = 1;
  app.add_option("lib_b", lib_b, "the other build's shared library (libqkv.so...)")->required();
  app.add_option("--rounds", rounds, "rounds of A and B in turn")->check(CLI::Range(1, 10000));
  app.add_option("--dtypes", dtype_names, "cache storage types")->delimiter(',')->check([](const std::string& d) {
    try {
      parse_kv_dtype(d, "a dtype");  // CLI11 names the option
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  });
  app.add_option("--tokens", tokens, "tokens in the cache")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--threads", threads, "thread counts")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--batch", batch, "sequences of M tokens each (D8: --batch 8 --tokens 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  app.add_flag("--hot", hot, "step one copy of each cache, left in the caches by the step before");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  void* lib = dlopen(lib_b.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (lib == nullptr) {
    std::fprintf(stderr, "qkv_decode_ab: cannot load %s: %s\n", lib_b.c_str(), dlerror());
    return 1;
  }
  const auto b = reinterpret_cast<DecodeFn>(dlsym(lib, kDecodeSymbol));
  if (b == nullptr) {
    std::fprintf(stderr, "qkv_decode_ab: %s has no qkv::decode_attention over a PagedKV\n", lib_b.c_str());
    return 1;
  }
  const DecodeFn a = static_cast<DecodeFn>(&decode_attention);
  const MachineInfo& m = machine_info();
  std::printf("decode A/B in one process: A = this build, B = %s; B%lld H32 Hkv8 D128, %s; %s (%s)\n", lib_b.c_str(),
              static_cast<long long>(batch), hot ? "hot (one copy of each cache)" : "cold (streamed from memory)",
              m.class_name.c_str(), m.brand.c_str());
  std::printf(
      "medians of %d rounds, wall µs per step; bits: A's and B's outputs of one step\n\n"
      "| dtype | M | thr | A | B | B / A | bits |\n|---|---|---|---|---|---|---|\n",
      rounds);
  std::vector<float> q(static_cast<std::size_t>(batch * kH * kD)), out(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 37) % 17) / 17.0f - 0.5f;
  for (const std::string& name : dtype_names)
    for (int64_t M : tokens) {
      const KVDtype dtype = parse_kv_dtype(name);
      std::vector<Setup> layers;
      std::vector<PagedKV> kv;
      const std::vector<int64_t> lens(static_cast<std::size_t>(batch), M);
      const int64_t page = KVCacheConfig{}.page_tokens;
      for (int layer = 0, n = hot ? 1 : cold_layers(dtype, lens, page); layer < n; ++layer) {
        layers.push_back(make_cache(dtype, lens, page, false, layer));
        kv.push_back(layers.back().cache->paged(layers.back().ids));
      }
      // About 20 ms of steps per sample, and at least a pass over the copies.
      const int steps = std::max(static_cast<int>(kv.size()), static_cast<int>(0.02 * 20e9 / layers[0].step_bytes));
      for (int64_t t : threads) {
        const int th = static_cast<int>(t);
        step_time(a, kv, th, q, out, static_cast<int>(kv.size()));  // warm-up: thread pool, scratch
        step_time(b, kv, th, q, out, static_cast<int>(kv.size()));
        std::vector<double> ta, tb, ratio;
        for (int r = 0; r < rounds; ++r) {
          const bool a_first = r % 2 == 0;
          const double first = step_time(a_first ? a : b, kv, th, q, out, steps);
          const double second = step_time(a_first ? b : a, kv, th, q, out, steps);
          ta.push_back(a_first ? first : second);
          tb.push_back(a_first ? second : first);
          ratio.push_back(tb.back() / ta.back());
        }
        std::printf("| %s | %lld | %d | %.2f | %.2f | %.3f | %s |\n", kv_dtype_name(dtype), static_cast<long long>(M),
                    th, median(ta) * 1e6, median(tb) * 1e6, median(ratio),
                    same_bits(a, b, kv[0], th, q) ? "same" : "differ");
        std::fflush(stdout);
      }
    }
  return 0;
}

}  // namespace
}  // namespace qkv::bench

int main(int argc, char** argv) { return qkv::bench::tool_main("qkv_decode_ab", qkv::bench::run, argc, argv); }
