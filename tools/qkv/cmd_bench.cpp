// `qkv bench`: what qkv does on this CPU. Prints the machine (cli_machine.h: class, L3, fp32 and
// bf16 peaks, read bandwidth at 1 thread and at --threads; --machine stops there), then times the
// user's shape through every path this CPU can run (the fused kernel on each SIMD family, and the
// float64 reference when the shape is small) and says which one the automatic choice takes, so a
// user sees the % of peak on their own machine. With --decode: one decode step against a paged KV
// cache, as a % of its roofline bound (bandwidth or FMA peak).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sched.h>

#include <fmt/format.h>

#include "qkv/machine_info.h"
#include "cli_machine.h"
#include "cli_util.h"
#include "commands.h"
#include "qkv/attention.h"
#include "qkv/decode.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/machine.h"

namespace qkv::cli {
namespace {

struct BenchArgs {
  std::string shape = "1,12,1024,1024,64";
  bool causal = false;
  std::string dtype = "f32";
  int threads = 0;
  int repeats = 5;
  std::string decode;  // B,H,Hkv,M,D: time decode_attention instead
  std::string kv_dtype = "f16";
  int64_t page_tokens = KVCacheConfig{}.page_tokens;
  bool machine_only = false;
  std::string json;  // with --machine: also write the figures here
};

// The reference (float64, N×M weights) is timed only below this many multiply-adds, and the
// scalar path (a few GFLOP/s: seconds a call) below the second.
constexpr double kReferenceLimit = 2e8;
constexpr double kScalarLimit = 1e10;
// What the run allocates for its tensors (inputs, their bf16 copies, output and lse; or the decode
// cache's pools with their pages' padding) stays below this.
constexpr double kMaxBytes = 4e9;
// Runs of each machine probe: the same whatever --repeats asks of the kernels' timings.
constexpr int kMachineRuns = 5;

struct Shape {
  int64_t B, H, N, M, D;
};

Shape parse_shape(const std::string& text) {
  const std::vector<int64_t> v = parse_int_list(text, "--shape");
  if (v.size() != 5) throw Error(fmt::format("--shape: expected B,H,N,M,D (5 values), got '{}'", text));
  for (int64_t x : v)
    if (x < 1 || x > (int64_t{1} << 24))
      throw Error(fmt::format("--shape: {} is outside 1 to 16777216 in '{}'", x, text));
  return {v[0], v[1], v[2], v[3], v[4]};
}

// Bytes the forward run allocates: q, k, v, out in fp32, their bf16 copies, lse.
double forward_bytes(const Shape& s, bool bf16_in) {
  const double elements = 2.0 * s.B * s.H * s.N * s.D + 2.0 * s.B * s.H * s.M * s.D;
  return (bf16_in ? 6.0 : 4.0) * elements + 4.0 * s.B * s.H * s.N;
}

// "12.6 MB", "4.19 GB", "1.27e+21 GB": what a refused size needs, readable at any size.
std::string gigabytes(double bytes) {
  return bytes < 1e9 ? fmt::format("{:.3g} MB", bytes / 1e6) : fmt::format("{:.3g} GB", bytes / 1e9);
}

// Query-key pairs the mask allows (causal: top-left, query i sees keys j <= i).
double allowed_pairs(const Shape& s, bool causal) {
  if (!causal) return static_cast<double>(s.N) * static_cast<double>(s.M);
  double pairs = 0;
  for (int64_t i = 0; i < s.N; ++i) pairs += static_cast<double>(std::min(i + 1, s.M));
  return pairs;
}

// Median wall time of `repeats` calls of fn after one warm-up call, in seconds.
template <class F>
double median_seconds(int repeats, F&& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median(std::move(t));
}

// x right-aligned in `width` with `decimals` decimals, or with two significant digits where those
// would show fewer, or print a positive x as zero (a tiny step slowed by the scheduler read "0.0" % roofline,
// and a tiny shape "0.000" ms at "0.0" GFLOP/s).
std::string fixed(double x, int width, int decimals) {
  if (x > 0 && x < std::pow(10.0, 1 - decimals))
    decimals = std::min(12, 1 - static_cast<int>(std::floor(std::log10(x))));
  return fmt::format("{:>{}.{}f}", x, width, decimals);
}

struct DecodeShape {
  int64_t B, H, Hkv, M, D;
};

DecodeShape parse_decode_shape(const std::string& text) {
  const std::vector<int64_t> v = parse_int_list(text, "--decode");
  if (v.size() != 5) throw Error(fmt::format("--decode: expected B,H,Hkv,M,D (5 values), got '{}'", text));
  for (int64_t x : v)
    if (x < 1 || x > (int64_t{1} << 24))
      throw Error(fmt::format("--decode: {} is outside 1 to 16777216 in '{}'", x, text));
  const DecodeShape s{v[0], v[1], v[2], v[3], v[4]};
  require_head_groups(s.H, s.Hkv, "--decode");
  return s;
}

int64_t pages_per_sequence(const DecodeShape& s, int64_t page_tokens) { return (s.M + page_tokens - 1) / page_tokens; }

// The cache the decode run builds: just enough pages for B sequences of M tokens.
KVCacheConfig decode_cache_config(const DecodeShape& s, KVDtype dtype, int64_t page_tokens) {
  return KVCacheConfig{s.B * pages_per_sequence(s, page_tokens), page_tokens, s.Hkv, s.D, s.D, dtype};
}

// One decode step (one query per sequence, causal) against B sequences of M tokens in pages of
// page_tokens, as a % of the roofline bound max(bytes read / read bandwidth, FLOPs / FMA peak),
// the bytes as decode_step_bytes counts them. Hot: the same cache step after step. Cold: a read of
// memory_probe_bytes() before each timed step evicts the cache, as a model's step finds each
// layer's cache in memory.
int run_bench_decode(const BenchArgs& a, int threads, double peak, double bandwidth) {
  const DecodeShape s = parse_decode_shape(a.decode);
  const KVDtype dtype = parse_kv_dtype(a.kv_dtype);
  KVCache cache(decode_cache_config(s, dtype, a.page_tokens));
  std::mt19937 gen(12345);
  std::normal_distribution<float> normal;
  const int64_t piece = std::min<int64_t>(s.M, 1024);
  std::vector<float> k(piece * s.Hkv * s.D), v(k.size());
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < s.B; ++b) {
    ids.push_back(cache.create());
    for (int64_t t = 0; t < s.M; t += piece) {
      const int64_t T = std::min(piece, s.M - t);
      for (float& x : k) x = normal(gen);
      for (float& x : v) x = normal(gen);
      cache.append(ids.back(), TensorView<const float>(k.data(), {T, s.Hkv, s.D}),
                   TensorView<const float>(v.data(), {T, s.Hkv, s.D}));
    }
  }
  Tensor<float> q({s.B, s.H, 1, s.D}, "qkv bench decode query"), out({s.B, s.H, 1, s.D}, "qkv bench decode output");
  for (int64_t i = 0; i < q.numel(); ++i) q[i] = normal(gen);
  const PagedKV kv = cache.paged(ids);
  DecodeOptions options;
  options.attention.num_threads = threads;
  options.attention.mask.causal = CausalAlign::bottom_right;
  auto step = [&] { decode_attention(out.view(), TensorView<float>(), q.cview(), kv, options); };

  const double tokens = static_cast<double>(s.B) * static_cast<double>(s.M);
  const double bytes = decode_step_bytes(cache.config(), kv.seq_lens);
  const double flops = 4.0 * tokens * s.H * s.D;
  const double bound = std::max(bytes / bandwidth, peak > 0 ? flops / peak : 0.0);
  fmt::print(
      "decode: reads {:.3g} MB (K+V and page table; {} cache, pages of {} token{}), {:.3g} GFLOP; "
      "bound {:.1f} us ({})\n",
      bytes / 1e6, kv_dtype_name(dtype), a.page_tokens, a.page_tokens == 1 ? "" : "s", flops / 1e9, bound * 1e6,
      peak > 0 && flops / peak > bytes / bandwidth ? "FMA peak" : "read bandwidth");
  const double hot = median_seconds(a.repeats, step);
  const std::vector<char> flush(static_cast<std::size_t>(memory_probe_bytes()), 1);
  std::vector<double> cold;
  volatile long sink = 0;
  for (int r = 0; r < a.repeats; ++r) {
    long sum = 0;  // reads every line of the buffer
    for (std::size_t i = 0; i < flush.size(); i += 64) sum += flush[i];
    sink = sink + sum;
    const auto start = std::chrono::steady_clock::now();
    step();
    cold.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  // A hot step whose bytes stay in cache reads them at the cache's rate, which no probe here
  // measures: its time over a bound from memory's bandwidth compares unlike things, so its row
  // shows GB/s and no %.
  const int64_t l3 = l3_cache_bytes();
  const bool hot_in_cache = stays_in_cache(bytes);
  fmt::print("{:<6} {:>10} {:>10} {:>12}\n", "cache", "time us", "GB/s", "% roofline");
  for (const auto& [name, seconds] : {std::pair{"cold", median(cold)}, std::pair{"hot", hot}}) {
    const bool no_bound = hot_in_cache && std::string_view(name) == "hot";
    fmt::print("{:<6} {} {} {}\n", name, fixed(seconds * 1e6, 10, 1), fixed(bytes / seconds / 1e9, 10, 2),
               no_bound ? fmt::format("{:>12}", "-") : fixed(100.0 * bound / seconds, 12, 1));
  }
  fmt::print(
      "(cold: a read of {} MiB before each step{}; % roofline above 100 means other programs\n"
      " slowed the bandwidth measurement, or the data stayed in cache{})\n",
      memory_probe_bytes() >> 20,
      l3 > 0 ? fmt::format(", {:.0f}x the {} MiB L3", static_cast<double>(memory_probe_bytes()) / l3, l3 >> 20) : "",
      hot_in_cache ? ";\n hot: no %, as its bytes fit in half the L3: it reads them from cache, not at the memory\n"
                     " bandwidth the bound divides by"
                   : "");
  // The eviction's own check: a cache that fits in the L3 must step slower cold than hot.
  const double ratio = median(cold) / hot;
  if (hot_in_cache)
    fmt::print("eviction check: the cold step takes {:.2f}x the hot one ({})\n", ratio,
               ratio > 1.05 ? "the eviction evicts" : "NOT slower: the eviction did not evict, or the machine is busy");
  else
    fmt::print("eviction check: cold / hot {:.2f} (its bytes {} half the L3: the hot step streams from memory too)\n",
               ratio, l3 > 0 ? "above" : "against an unknown L3;");
  return 0;
}

int run_bench(const BenchArgs& a) {
  check_output_paths({{"--json", a.json}});  // before the probes' seconds, not after them
  const Shape s = parse_shape(a.shape);
  const int threads = a.threads > 0 ? a.threads : default_num_threads();
  const bool bf16_in = a.dtype == "bf16";
  // Each SIMD path is held to its own instruction set's peak: an AVX2 path against AVX2's (what a
  // CPU without AVX-512 reaches), the rest against the machine's best, measured at this run's
  // thread count (a peak from another count let a kernel "reach" more than 100%).
  std::vector<int> counts{1};
  if (threads > 1) counts.push_back(threads);
  // The path the automatic choice takes: an invalid QKV_SIMD stops here, before the probes.
  const std::string automatic = simd_path_name(Simd::automatic);
  const std::vector<MachineFigures> figures = measure_machine(counts, kMachineRuns);
  const MachineFigures& mine = figures.back();
  const double peak256 = mine.avx2.best, peak = mine.fp32_peak();
  const double peak_bf16 = bf16_product_isa(s.D, s.D) == PeakIsa::amx_bf16 ? mine.amx.best : mine.bf16.best;
  const double bandwidth = mine.bandwidth.best;
  if (a.machine_only) {
    fmt::print("qkv bench --machine: threads {}\n", threads);
    print_machine(figures, automatic);
    if (!a.json.empty()) write_outputs({{a.json, machine_json(figures, automatic).dump(1) + "\n"}});
    return 0;
  }
  if (!a.decode.empty()) {
    const DecodeShape d = parse_decode_shape(a.decode);
    fmt::print("qkv bench --decode: B={} H={} Hkv={} M={} D={} kv-dtype {} threads {}\n", d.B, d.H, d.Hkv, d.M, d.D,
               kv_dtype_name(parse_kv_dtype(a.kv_dtype)), threads);
    print_machine(figures, automatic);
    return run_bench_decode(a, threads, peak, bandwidth);
  }
  const double flops = 2.0 * allowed_pairs(s, a.causal) * static_cast<double>(s.D) * 2.0 * s.B * s.H;
  const double bytes = (bf16_in ? 2.0 : 4.0) * (s.B * s.H * s.N * s.D + 2.0 * s.B * s.H * s.M * s.D) +
                       4.0 * s.B * s.H * s.N * s.D;  // q, k, v read; out (fp32) written

  std::mt19937 gen(12345);
  std::normal_distribution<float> normal;
  auto random = [&](int64_t L) {
    Tensor<float> t({s.B, s.H, L, s.D}, "qkv bench input");
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = normal(gen);
    return t;
  };
  const Tensor<float> q = random(s.N), k = random(s.M), v = random(s.M);
  auto narrow = [](const Tensor<float>& t) {
    Tensor<bf16> b(t.shape(), "qkv bench bf16 input");
    for (int64_t i = 0; i < t.numel(); ++i) b[i] = float_to_bf16(t[i]);
    return b;
  };
  Tensor<bf16> qb, kb, vb;
  if (bf16_in) qb = narrow(q), kb = narrow(k), vb = narrow(v);
  Tensor<float> out({s.B, s.H, s.N, s.D}, "qkv bench output"), lse({s.B, s.H, s.N}, "qkv bench lse");

  fmt::print("qkv bench: B={} H={} N={} M={} D={}{} dtype {} threads {}\n", s.B, s.H, s.N, s.M, s.D,
             a.causal ? " causal" : "", a.dtype, threads);
  print_machine(figures, automatic);
  fmt::print("forward: {:.3g} GFLOP (4·pairs·D), {:.3g} MB moved\n", flops / 1e9, bytes / 1e6);
  fmt::print("{:<10} {:>10} {:>10} {:>8} {:>7}\n", "path", "time ms", "GFLOP/s", "GB/s", "% peak");

  struct Path {
    std::string name;
    Kernel kernel;
    Simd simd;
  };
  std::vector<Path> paths;
  const bool small = flops / 2 <= kReferenceLimit;
  for (Simd simd : {Simd::avx512, Simd::avx2, Simd::neon, Simd::scalar}) {
    if (simd == Simd::scalar && flops / 2 > kScalarLimit) continue;
    try {
      paths.push_back({simd_path_name(simd), Kernel::fused, simd});
    } catch (const Error&) {  // this CPU lacks it
    }
  }
  if (small) paths.push_back({"reference", Kernel::reference, Simd::automatic});
  for (const Path& p : paths) {
    AttentionOptions options;
    options.kernel = p.kernel;
    options.simd = p.simd;
    options.num_threads = threads;
    if (a.causal) options.mask.causal = CausalAlign::top_left;
    const double seconds = median_seconds(a.repeats, [&] {
      if (bf16_in)
        attention_forward(out.view(), lse.view(), qb.cview(), kb.cview(), vb.cview(), options);
      else
        attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
    });
    // bf16 inputs on AVX-512 run their products on AMX tiles or vdpbf16ps where the CPU has them:
    // that peak.
    const bool dot = bf16_in && p.kernel == Kernel::fused && p.simd == Simd::avx512 && peak_bf16 > 0;
    const double own = p.kernel == Kernel::fused && p.simd == Simd::avx2 ? peak256 : dot ? peak_bf16 : peak;
    const std::string pct = own > 0 ? fixed(100.0 * flops / seconds / own, 7, 1) : "      -";
    fmt::print("{:<10} {} {} {} {}{}\n", p.name, fixed(seconds * 1e3, 10, 3), fixed(flops / seconds / 1e9, 10, 1),
               fixed(bytes / seconds / 1e9, 8, 2), pct,
               p.kernel == Kernel::fused && p.name == automatic ? "  <- automatic" : "");
  }
  if (!small) fmt::print("reference: skipped (more than {:.0e} multiply-adds)\n", kReferenceLimit);
  if (flops / 2 > kScalarLimit) fmt::print("scalar: skipped (more than {:.0e} multiply-adds)\n", kScalarLimit);
  fmt::print("automatic choice: fused {} (QKV_SIMD overrides it)\n", automatic);
  if (peak > 0)
    fmt::print(
        "(% peak: of the path's own instruction set's peak (avx2: AVX2's FMA; avx512 with bf16 inputs: AMX's\n"
        " tile product or the bf16 dot product, whichever the kernel runs), the others of the machine's fp32 FMA "
        "peak;\n"
        " above 100 means other programs slowed the peak measurement)\n");
  return 0;
}

// A validator that parses the text with parse (which throws qkv::Error "<option>: why") and shows
// the reason without the option's name, which CLI11 adds.
template <class Parse>
CLI::Validator parsed_by(Parse parse, const std::string& option, const std::string& form) {
  return CLI::Validator(
      [parse, prefix = option + ": "](std::string& text) -> std::string {
        try {
          parse(text);
          return {};
        } catch (const Error& e) {
          std::string message = e.what();
          if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
          return message;
        }
      },
      form, "");
}

// CPUs this process may run on: its affinity (taskset, a cpuset), which the machine's count ignores.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

// The checks that need several options, as usage errors before any probe runs.
void check_bench_args(const BenchArgs& a) {
  // More threads than CPUs time the scheduler, not qkv (and took minutes at 128 on 2 CPUs).
  const int threads = a.threads > 0 ? a.threads : default_num_threads();
  const int cpus = usable_cpus();
  if (cpus > 0 && threads > cpus) {
    const std::string from =
        a.threads > 0 ? "--threads" : "the default thread count (QKV_NUM_THREADS, else OMP_NUM_THREADS or the CPUs)";
    usage_error(
        fmt::format("{} {}: this process may run on {} CPU{}; a benchmark with more threads than CPUs "
                    "times the scheduler, not qkv",
                    from, threads, cpus, cpus == 1 ? "" : "s"));
  }
  if (!a.decode.empty()) {
    const DecodeShape d = parse_decode_shape(a.decode);
    const double bytes = kv_cache_bytes(decode_cache_config(d, parse_kv_dtype(a.kv_dtype), a.page_tokens));
    if (bytes > kMaxBytes)
      usage_error(fmt::format("--decode {} --page-tokens {}: the cache needs {} in whole pages (at most 4 GB)",
                              a.decode, a.page_tokens, gigabytes(bytes)));
  } else if (!a.machine_only) {
    const double bytes = forward_bytes(parse_shape(a.shape), a.dtype == "bf16");
    if (bytes > kMaxBytes)
      usage_error(fmt::format("--shape {}: needs {} of tensors (at most 4 GB)", a.shape, gigabytes(bytes)));
  }
}

}  // namespace

Command add_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Measures this machine's fp32 FMA, bf16 dot and AMX tile peaks and read bandwidth, then times\n"
      "attention_forward on a shape through every path this CPU can run (fused avx512 / avx2 / scalar;\n"
      "the float64 reference for small shapes): time (median), GFLOP/s, GB/s, % of the FMA peak, and the\n"
      "path the automatic choice takes.");
  CLI::Option* shape = sub->add_option("--shape", args->shape, "B,H,N,M,D (default 1,12,1024,1024,64)")
                           ->check(parsed_by([](const std::string& t) { parse_shape(t); }, "--shape", "B,H,N,M,D"));
  CLI::Option* decode =
      sub->add_option("--decode", args->decode,
                      "B,H,Hkv,M,D: time one decode step (one query per sequence of M tokens) against a paged\n"
                      "KV cache instead, cold and hot, as a % of its roofline bound")
          ->check(parsed_by([](const std::string& t) { parse_decode_shape(t); }, "--decode", "B,H,Hkv,M,D"));
  CLI::Option* kv_dtype =
      sub->add_option("--kv-dtype", args->kv_dtype,
                      "With --decode: the cache's dtype f32, bf16, f16 or i8 (default f16)")
          ->check(parsed_by([](const std::string& t) { parse_kv_dtype(t); }, "--kv-dtype", "DTYPE"));
  CLI::Option* machine =
      sub->add_flag("--machine", args->machine_only,
                    "Only the machine: its class, L3 and cold-cache eviction, FMA and bf16 peaks and read bandwidth\n"
                    "(1, 2, 4 and 8 streams per thread) at 1 thread and at --threads");
  CLI::Option* json =
      sub->add_option("--json", args->json, "With --machine: also write the figures as JSON to this file");
  CLI::Option* page_tokens = sub->add_option("--page-tokens", args->page_tokens,
                                             fmt::format("With --decode: tokens per page (default {}, the cache's)",
                                                         KVCacheConfig{}.page_tokens))
                                 ->check(integer_in(1, 1 << 24));
  CLI::Option* causal = sub->add_flag("--causal", args->causal, "Causal mask (top-left)");
  CLI::Option* dtype = sub->add_option("--dtype", args->dtype, "f32 or bf16 inputs (default f32)")
                           ->check(CLI::IsMember({"f32", "bf16"}));
  // An option the chosen mode would ignore is a usage error, not a silent no-op.
  json->needs(machine);
  kv_dtype->needs(decode);
  page_tokens->needs(decode);
  decode->excludes(machine);
  for (CLI::Option* forward_only : {shape, causal, dtype}) forward_only->excludes(decode)->excludes(machine);
  sub->add_option("--threads", args->threads, "Threads (default QKV_NUM_THREADS or all cores)")
      ->check(integer_in(1, 4096));
  sub->add_option("--repeats", args->repeats,
                  fmt::format("Timed calls per path; the median is shown (default 5; the machine's probes run {} "
                              "times whatever this asks)",
                              kMachineRuns))
      ->check(integer_in(1, 1000))
      ->excludes(machine);
  on_parse_complete(sub, [args] { check_bench_args(*args); });
  return {sub, [args] { return run_bench(*args); }};
}

}  // namespace qkv::cli
