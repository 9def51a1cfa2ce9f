// Property tests at scale: QKV_PROPERTY_CASES random problems (default 1,000; `make check-long`
// runs 10,000) of the fused forward kernel on every SIMD path and of attention_backward, each
// against the float64 reference, over every mask kind, odd shapes, strided layouts and thread
// counts. Prints the worst error per category, so docs/testing.md reports measured figures.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "attention_cases.h"
#include "qkv/backward.h"
#include "qkv/reference.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::max_abs;

int64_t case_count() {
  if (const char* env = std::getenv("QKV_PROPERTY_CASES")) {
    const long long n = std::strtoll(env, nullptr, 10);
    if (n > 0) return n;
  }
  return 1000;
}

// The categories a problem belongs to: its mask kinds, its shape class and its layout.
std::vector<std::string> categories(const test::Problem& p) {
  std::vector<std::string> c;
  const Mask& m = p.options.mask;
  if (m.causal) c.push_back(*m.causal == CausalAlign::top_left ? "mask causal top_left" : "mask causal bottom_right");
  if (m.window) c.push_back("mask window");
  if (!m.key_lengths.empty()) c.push_back("mask key_lengths");
  if (!m.query_lengths.empty()) c.push_back("mask query_lengths");
  if (!m.keep.empty()) c.push_back("mask keep");
  if (!m.bias.empty()) c.push_back("mask bias");
  if (!m.alibi_slopes.empty()) c.push_back("mask alibi");
  if (m.softcap > 0) c.push_back("mask softcap");
  if (c.empty()) c.push_back("mask none");
  const AttentionShape& s = p.shape;
  if (s.H != s.Hkv) c.push_back("shape GQA (H > Hkv)");
  if (s.N != s.M) c.push_back("shape cross (N != M)");
  if (s.N <= 3 || s.M <= 3) c.push_back("shape tiny (N or M <= 3)");
  if (s.D % 16 != 0 || s.Dv % 16 != 0) c.push_back("shape odd D or Dv");
  const bool strided = !p.q.view.is_contiguous() || !p.k.view.is_contiguous() || !p.v.view.is_contiguous() ||
                       !p.out.view.is_contiguous();
  c.push_back(strided ? "layout strided" : "layout contiguous");
  return c;
}

struct Worst {
  int64_t cases = 0;
  double err = 0;    // |got − ref| / (1 + max|ref|) for outputs, / max(1, max|ref|) for gradients
  double lse = 0;    // |got − ref| / (1 + |ref|)
  double ratio = 0;  // the largest error / tolerance
  std::string where;
};

void record(std::map<std::string, Worst>& table, const std::string& category, double err, double lse, double ratio,
            const std::string& where) {
  Worst& w = table[category];
  ++w.cases;
  w.ratio = std::max(w.ratio, ratio);
  if (err > w.err) w.where = where;
  w.err = std::max(w.err, err);
  w.lse = std::max(w.lse, lse);
}

void print(const std::map<std::string, Worst>& table, const char* title, const char* err_name) {
  std::printf("%s\n  %-28s %8s %12s %12s %12s\n", title, "category", "cases", err_name, "lse err", "err/tol");
  for (const auto& [name, w] : table)
    std::printf("  %-28s %8lld %12.3e %12.3e %12.3f\n", name.c_str(), static_cast<long long>(w.cases), w.err, w.lse,
                w.ratio);
}

// The forward errors of one run. Masked rows (reference lse = -inf) must be exactly 0 and -inf;
// any other mismatch there is reported as an infinite error.
struct Errors {
  double out = 0, lse = 0;
};
Errors forward_errors(const test::Problem& p, const test::Expected& e) {
  const AttentionShape& s = p.shape;
  double max_ref = 0;
  for (int64_t i = 0; i < e.out.numel(); ++i) max_ref = std::max(max_ref, std::abs(e.out[i]));
  Errors r;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i) {
        const double want = e.lse.cview()(b, h, i), got = p.lse.cview()(b, h, i);
        const bool masked = std::isinf(want);
        if (masked && got != want) r.lse = INFINITY;
        if (!masked) r.lse = std::max(r.lse, std::abs(got - want) / (1 + std::abs(want)));
        if (std::isnan(got)) r.lse = INFINITY;
        for (int64_t d = 0; d < s.Dv; ++d) {
          const double o = p.out.view(b, h, i, d);
          const double err =
              masked ? (o == 0.0 ? 0.0 : INFINITY) : std::abs(o - e.out.cview()(b, h, i, d)) / (1 + max_ref);
          r.out = std::isnan(err) ? INFINITY : std::max(r.out, err);
        }
      }
  return r;
}

// Forward tolerance: 2e-5 relative, plus the rounding of the fp32 scores themselves. A score s
// (with its ALiBi and bias terms) is rounded to about eps32·|s|, which shifts its weight by that
// relative amount; with ALiBi over 1,000 keys |s| reaches ~500, so this term matters there.
constexpr double kForwardTolerance = 2e-5;
constexpr double kEps32 = 5.96e-8;

// The tolerance for out (relative to 1 + max|ref|, as forward_errors measures it) and for lse.
double forward_tolerance(const test::Problem& p, const test::Expected& e) {
  double max_ref = 0;
  for (int64_t i = 0; i < e.out.numel(); ++i) max_ref = std::max(max_ref, std::abs(e.out[i]));
  const double v = max_abs(TensorView<const float>(p.v.view));
  return kForwardTolerance + 4 * kEps32 * test::score_bound(p) * v / (1 + max_ref);
}
constexpr double kBackwardTolerance = 2e-4;

TEST(Property, FusedForwardMatchesReferenceOnEveryPath) {
  test::Rng rng("Property.FusedForward");
  const int64_t cases = case_count();
  const std::vector<Simd> paths = test::available_paths();
  std::map<std::string, Worst> table;
  int64_t failures = 0;
  for (int64_t trial = 0; trial < cases; ++trial) {
    test::Problem p = test::random_problem(rng);
    const test::Expected want = test::reference_of(p);
    const double tol = forward_tolerance(p, want);
    // lse rounds like one score: eps32·|s| on top of the relative tolerance.
    const double lse_tol = kForwardTolerance + 4 * kEps32 * test::score_bound(p);
    for (Simd simd : paths) {
      const int threads = static_cast<int>(rng.uniform_int(1, 4));
      test::run_fused(p, simd, threads);
      const Errors e = forward_errors(p, want);
      const std::string where =
          fmt::format("trial {} {} threads {}: {}", trial, simd_path_name(simd), threads, p.describe);
      std::vector<std::string> cats = categories(p);
      cats.push_back(fmt::format("simd {}", simd_path_name(simd)));
      cats.push_back(fmt::format("threads {}", threads));
      cats.push_back("all");
      const double ratio = std::max(e.out / tol, e.lse / lse_tol);
      for (const std::string& c : cats) record(table, c, e.out, e.lse, ratio, where);
      if (!(e.out <= tol && e.lse <= lse_tol) && ++failures <= 5)
        ADD_FAILURE() << "out err " << e.out << " (tol " << tol << "), lse err " << e.lse << " (tol " << lse_tol
                      << ") at " << where;
    }
  }
  print(table,
        fmt::format("fused forward vs float64 reference: {} problems x {} SIMD paths", cases, paths.size()).c_str(),
        "out err");
  std::printf("  worst overall at %s\n", table["all"].where.c_str());
  EXPECT_EQ(table["all"].cases, cases * static_cast<int64_t>(paths.size()));
}

// max |got − want| / max(1, max|want|): relative to the gradient's scale, floored at the scale of
// the inputs (all N(0, 1)), because dS = P ∘ (dP − rowsum(dout ∘ out)) cancels: a small gradient
// still carries the fp32 rounding of its O(1) terms.
double gradient_error(TensorView<const float> got, const Tensor<double>& want) {
  const double scale = std::max(1.0, max_abs(want));
  const Tensor<double> g = to_contiguous<double>(got);
  double worst = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double err = std::abs(g[i] - want[i]) / scale;
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
  }
  return worst;
}

TEST(Property, BackwardMatchesReference) {
  test::Rng rng("Property.Backward");
  const int64_t cases = case_count();
  std::map<std::string, Worst> table;
  int64_t failures = 0;
  for (int64_t trial = 0; trial < cases; ++trial) {
    // The float64 backward reference costs about three forwards: a smaller budget per problem.
    test::Problem p = test::random_problem(rng, 6e5);
    const AttentionShape& s = p.shape;
    const int threads = static_cast<int>(rng.uniform_int(1, 4));
    test::run_fused(p, Simd::automatic, threads);
    Tensor<float> dout = rng.normal32(std::array<int64_t, 4>{s.B, s.H, s.N, s.Dv});
    Tensor<float> dq({s.B, s.H, s.N, s.D}), dk({s.B, s.Hkv, s.M, s.D}), dv({s.B, s.Hkv, s.M, s.Dv});
    Tensor<float> dbias;
    const bool want_bias = rng.uniform_int(0, 1) == 1;
    if (want_bias) dbias = Tensor<float>({s.B, s.H, s.N, s.M});
    AttentionOptions options = p.options;
    options.num_threads = threads;
    attention_backward(dq.view(), dk.view(), dv.view(), dbias.view(), dout.cview(), TensorView<const float>(p.q.view),
                       TensorView<const float>(p.k.view), TensorView<const float>(p.v.view),
                       TensorView<const float>(p.out.view), p.lse.cview(), options);
    const Tensor<double> q = to_contiguous<double>(TensorView<const float>(p.q.view));
    const Tensor<double> k = to_contiguous<double>(TensorView<const float>(p.k.view));
    const Tensor<double> v = to_contiguous<double>(TensorView<const float>(p.v.view));
    const Tensor<double> dout64 = to_contiguous<double>(dout.cview());
    Tensor<double> rq({s.B, s.H, s.N, s.D}), rk({s.B, s.Hkv, s.M, s.D}), rv({s.B, s.Hkv, s.M, s.Dv});
    Tensor<double> rbias;
    if (want_bias) rbias = Tensor<double>({s.B, s.H, s.N, s.M});
    reference_attention_backward(rq.view(), rk.view(), rv.view(), rbias.view(), dout64.cview(), q.cview(), k.cview(),
                                 v.cview(), p.options);
    double err =
        std::max({gradient_error(dq.cview(), rq), gradient_error(dk.cview(), rk), gradient_error(dv.cview(), rv)});
    if (want_bias) err = std::max(err, gradient_error(dbias.cview(), rbias));
    const std::string where = fmt::format("trial {} threads {} dbias {}: {}", trial, threads, want_bias, p.describe);
    std::vector<std::string> cats = categories(p);
    cats.push_back(fmt::format("threads {}", threads));
    cats.push_back(want_bias ? "with dbias" : "without dbias");
    cats.push_back("all");
    // As for the forward: the rounding of scores of magnitude S shifts each weight by ~eps32·S.
    const double tol = kBackwardTolerance + 4 * kEps32 * test::score_bound(p);
    for (const std::string& c : cats) record(table, c, err, 0, err / tol, where);
    if (!(err <= tol) && ++failures <= 5)
      ADD_FAILURE() << "gradient err " << err << " (tol " << tol << ") at " << where;
  }
  print(table, fmt::format("attention_backward vs float64 reference: {} problems", cases).c_str(), "grad err");
  std::printf("  worst overall at %s\n", table["all"].where.c_str());
  EXPECT_EQ(table["all"].cases, cases);
}

}  // namespace
}  // namespace qkv
