// Is a change to the forward or backward kernel faster? This binary's own build of qkv (A) against
// another build's shared library (B: e.g. build/libqkv.so.0.3 copied aside before the change), both
// in this one process, as qkv_decode_ab does for decode: B is loaded with dlopen(RTLD_DEEPBIND), so
// that its calls stay inside its own copy of the library, and both run on the same inputs, A and B
// in turn, the first of the two alternating round by round. Whole processes in turn (two
// qkv_bench binaries) drew rates 10-20% apart on a shared Zen 5 host within minutes, more than the
// changes they were to measure; in one process both sides share the host's minute.
//   build/bench/qkv_attention_ab LIB_B [--shapes S2,S3,1x2x4096x256] [--threads 1,2] [--rounds R]
//                                      [--backward | --bf16]
// Shapes are bench/shapes.h's names or BxHxNxD (not causal, q, k and v N(0, 1)). Prints per case
// the medians over rounds of A's and B's wall time per call, the median and range of the rounds'
// ratios B / A, and whether the two builds' outputs have the same bits. --bf16 times the forward
// on q, k and v rounded to bf16.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "qkv/attention.h"
#include "qkv/backward.h"
#include "qkv/error.h"
#include "qkv/machine_info.h"
#include "shapes.h"
#include "tool_main.h"

namespace qkv::bench {
namespace {

// attention_forward (fp32 or bf16 inputs) and attention_backward (fp32), with fp32 lse, the
// overloads both builds run, and their symbols in the other build (the Itanium C++ ABI's names, as
// GCC and Clang mangle them).
using ForwardFn = void (*)(TensorView<float>, TensorView<float>, TensorView<const float>, TensorView<const float>,
                           TensorView<const float>, const AttentionOptions&);
using ForwardBf16Fn = void (*)(TensorView<float>, TensorView<float>, TensorView<const bf16>, TensorView<const bf16>,
                               TensorView<const bf16>, const AttentionOptions&);
using BackwardFn = void (*)(TensorView<float>, TensorView<float>, TensorView<float>, TensorView<float>,
                            TensorView<const float>, TensorView<const float>, TensorView<const float>,
                            TensorView<const float>, TensorView<const float>, TensorView<const float>,
                            const AttentionOptions&);
constexpr const char* kForwardSymbol =
    "_ZN3qkv17attention_forwardENS_10TensorViewIfEES1_NS0_IKfEES3_S3_RKNS_16AttentionOptionsE";
constexpr const char* kForwardBf16Symbol =
    "_ZN3qkv17attention_forwardENS_10TensorViewIfEES1_NS0_IKNS_4bf16EEES4_S4_RKNS_16AttentionOptionsE";
constexpr const char* kBackwardSymbol =
    "_ZN3qkv18attention_backwardENS_10TensorViewIfEES1_S1_S1_NS0_IKfEES3_S3_S3_S3_S3_RKNS_16AttentionOptionsE";

struct Build {
  ForwardFn forward;
  BackwardFn backward;
  ForwardBf16Fn forward_bf16;
};

// What a case times, and its name in the printed title.
enum class Work { forward, backward, forward_bf16 };
const char* name_of(Work w) {
  return w == Work::backward ? "backward" : w == Work::forward ? "forward" : "bf16 forward";
}

// One case's inputs and both builds' outputs.
struct Problem {
  Shape shape;
  std::vector<float> q, k, v, dout, out, lse;
  std::vector<bf16> qb, kb, vb;  // --bf16: q, k and v rounded
  std::vector<float> result[2];  // out (forward) or dq, dk, dv one after another (backward)
  std::array<int64_t, 4> dims() const { return {shape.B, shape.H, shape.N, shape.D}; }
  std::array<int64_t, 3> rows() const { return {shape.B, shape.H, shape.N}; }
};

constexpr int64_t kMaxElements = int64_t{1} << 31;

Shape parse_shape(const std::string& s) {
  for (const Shape& k : kShapes)
    if (s == k.name) return k;
  Shape x{"", 0, 0, 0, 0, false};
  char sep[3] = {};
  std::istringstream in(s);
  in >> x.B >> sep[0] >> x.H >> sep[1] >> x.N >> sep[2] >> x.D;
  const bool sizes = x.B >= 1 && x.H >= 1 && x.N >= 1 && x.D >= 1 && x.B <= kMaxElements / x.H &&
                     x.B * x.H <= kMaxElements / x.N && x.B * x.H * x.N <= kMaxElements / x.D;
  if (!in || !in.eof() || sep[0] != 'x' || sep[1] != 'x' || sep[2] != 'x' || !sizes)
    throw Error("shape '" + s +
                "': a name of bench/shapes.h (S2, S3, ...) or BxHxNxD, each at least 1 and B·H·N·D at most 2^31");
  return x;
}

// Calls `build` once on the problem, into its result slot `slot`.
void call(const Build& build, Problem& p, int threads, Work work, int slot) {
  AttentionOptions o;
  o.num_threads = threads;
  if (p.shape.causal) o.mask.causal = CausalAlign::top_left;
  const auto d = p.dims();
  const auto cf = [&](const std::vector<float>& x) { return TensorView<const float>(x.data(), d); };
  std::vector<float>& r = p.result[slot];
  const std::size_t n = p.q.size();
  if (work == Work::forward_bf16) {
    const auto cb = [&](const std::vector<bf16>& x) { return TensorView<const bf16>(x.data(), d); };
    build.forward_bf16(TensorView<float>(r.data(), d), TensorView<float>(p.lse.data(), p.rows()), cb(p.qb), cb(p.kb),
                       cb(p.vb), o);
    return;
  }
  if (work == Work::forward) {
    build.forward(TensorView<float>(r.data(), d), TensorView<float>(p.lse.data(), p.rows()), cf(p.q), cf(p.k), cf(p.v),
                  o);
    return;
  }
  build.backward(TensorView<float>(r.data(), d), TensorView<float>(r.data() + n, d),
                 TensorView<float>(r.data() + 2 * n, d), TensorView<float>(), cf(p.dout), cf(p.q), cf(p.k), cf(p.v),
                 cf(p.out), TensorView<const float>(p.lse.data(), p.rows()), o);
}

// Seconds per call: a sample of at least 20 ms (at least one call).
double call_time(const Build& build, Problem& p, int threads, Work work, int slot, int calls) {
  const auto start = std::chrono::steady_clock::now();
  for (int c = 0; c < calls; ++c) call(build, p, threads, work, slot);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
}

int run(int argc, char** argv) {
  CLI::App app("The forward or backward of this build (A) against another build's libqkv (B), in one process.");
  std::string lib_b;
  int rounds = 11;
  bool backward = false, bf16_inputs = false;
  std::vector<std::string> shape_names{"S2", "S3", "S4"};
  std::vector<int64_t> threads{1};
  app.add_option("lib_b", lib_b, "the other build's shared library (libqkv.so...)")->required();
  app.add_option("--rounds", rounds, "rounds of A and B in turn")->check(CLI::Range(1, 10000));
  app.add_option("--shapes", shape_names, "bench/shapes.h names or BxHxNxD")
      ->delimiter(',')
      ->check([](const std::string& s) {
        try {
          parse_shape(s);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
  app.add_option("--threads", threads, "thread counts")->delimiter(',')->check(CLI::Range(1, 1024));
  auto* back = app.add_flag("--backward", backward, "time the backward (the forward's out and lse from A)");
  app.add_flag("--bf16", bf16_inputs, "time the forward on q, k and v rounded to bf16")->excludes(back);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::vector<Shape> shapes;
  for (const std::string& s : shape_names) shapes.push_back(parse_shape(s));
  void* lib = dlopen(lib_b.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (lib == nullptr) {
    std::fprintf(stderr, "qkv_attention_ab: cannot load %s: %s\n", lib_b.c_str(), dlerror());
    return 1;
  }
  const Work work = backward ? Work::backward : bf16_inputs ? Work::forward_bf16 : Work::forward;
  const Build b{reinterpret_cast<ForwardFn>(dlsym(lib, kForwardSymbol)),
                reinterpret_cast<BackwardFn>(dlsym(lib, kBackwardSymbol)),
                reinterpret_cast<ForwardBf16Fn>(dlsym(lib, kForwardBf16Symbol))};
  if (b.forward == nullptr || b.backward == nullptr || b.forward_bf16 == nullptr) {
    std::fprintf(stderr,
                 "qkv_attention_ab: %s has no qkv::attention_forward (fp32 and bf16) and fp32 attention_backward\n",
                 lib_b.c_str());
    return 1;
  }
  const Build a{static_cast<ForwardFn>(&attention_forward), static_cast<BackwardFn>(&attention_backward),
                static_cast<ForwardBf16Fn>(&attention_forward)};
  const MachineInfo& m = machine_info();
  std::printf("%s A/B in one process: A = this build, B = %s; %s (%s)\n", name_of(work), lib_b.c_str(),
              m.class_name.c_str(), m.brand.c_str());
  std::printf(
      "medians of %d rounds, wall µs per call; bits: A's and B's outputs\n\n"
      "| shape | thr | A | B | B / A | rounds' B / A | bits |\n|---|---|---|---|---|---|---|\n",
      rounds);
  for (const Shape& s : shapes) {
    Problem p;
    p.shape = s;
    draw_inputs(s, p.q, p.k, p.v, &p.dout);
    const std::size_t n = p.q.size();
    p.lse.resize(static_cast<std::size_t>(s.B * s.H * s.N));
    if (bf16_inputs)
      for (auto [x, y] : {std::pair{&p.q, &p.qb}, {&p.k, &p.kb}, {&p.v, &p.vb}})
        std::transform(x->begin(), x->end(), std::back_inserter(*y), float_to_bf16);
    for (auto& r : p.result) r.resize(backward ? 3 * n : n);
    if (backward) {  // the backward's out and lse: A's forward
      p.out.resize(n);
      call(a, p, 1, Work::forward, 0);
      std::copy_n(p.result[0].begin(), n, p.out.begin());
    }
    for (int64_t t : threads) {
      const int th = static_cast<int>(t);
      const double first = call_time(a, p, th, work, 0, 1);  // warm-up: thread pool, scratch
      call_time(b, p, th, work, 1, 1);
      const bool same = std::memcmp(p.result[0].data(), p.result[1].data(), p.result[0].size() * sizeof(float)) == 0;
      const int calls = std::max(1, static_cast<int>(0.02 / first));
      std::vector<double> ta, tb, ratio;
      for (int r = 0; r < rounds; ++r) {
        const bool a_first = r % 2 == 0;
        const double t1 = call_time(a_first ? a : b, p, th, work, a_first ? 0 : 1, calls);
        const double t2 = call_time(a_first ? b : a, p, th, work, a_first ? 1 : 0, calls);
        ta.push_back(a_first ? t1 : t2);
        tb.push_back(a_first ? t2 : t1);
        ratio.push_back(tb.back() / ta.back());
      }
      std::printf("| %s%s%lldx%lldx%lldx%lld | %d | %.2f | %.2f | %.3f | %.3f-%.3f | %s |\n", s.name,
                  *s.name ? " " : "", static_cast<long long>(s.B), static_cast<long long>(s.H),
                  static_cast<long long>(s.N), static_cast<long long>(s.D), th, median(ta) * 1e6, median(tb) * 1e6,
                  median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                  *std::max_element(ratio.begin(), ratio.end()), same ? "same" : "differ");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace qkv::bench

int main(int argc, char** argv) { return qkv::bench::tool_main("qkv_attention_ab", qkv::bench::run, argc, argv); }
