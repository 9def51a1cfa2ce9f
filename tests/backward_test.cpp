// Attention backward: the float64 reference against finite differences, the fp32 kernel on every
// SIMD path against the reference (masks, GQA, cross-attention, odd sizes, strides, several query
// chunks), bitwise determinism across thread counts on every path, fully masked rows, bad shapes.
#include "qkv/backward.h"

#include <malloc.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "attention_cases.h"
#include "qkv/reference.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::max_abs;

// One random attention problem with its masks' storage.
struct Case {
  AttentionShape s;
  AttentionOptions options;
  Tensor<uint8_t> keep;
  Tensor<float> bias;
  std::string describe() const {
    const Mask& m = options.mask;
    return fmt::format(
        "B={} H={} Hkv={} N={} M={} D={} Dv={} causal={} window=[{}, {}] keys={} queries={} keep={} bias={} "
        "alibi={} softcap={}",
        s.B, s.H, s.Hkv, s.N, s.M, s.D, s.Dv, m.causal ? int(*m.causal) : -1, m.window ? m.window->left : -9,
        m.window ? m.window->right : -9, !m.key_lengths.empty(), !m.query_lengths.empty(), !m.keep.empty(),
        !m.bias.empty(), !m.alibi_slopes.empty(), m.softcap);
  }
};

// Random sizes and a random subset of every mask kind. max_len bounds N and M.
Case random_case(test::Rng& rng, int64_t max_len, bool all_masks = false) {
  Case c;
  c.s.B = rng.uniform_int(1, 2);
  c.s.Hkv = rng.uniform_int(1, 2);
  c.s.H = c.s.Hkv * rng.uniform_int(1, 3);
  c.s.N = rng.uniform_int(1, max_len);
  c.s.M = rng.uniform_int(0, 3) == 0 ? c.s.N : rng.uniform_int(1, max_len);
  const int64_t dims[] = {1, 3, 8, 17, 40, 59};
  c.s.D = dims[rng.uniform_int(0, 5)];
  c.s.Dv = rng.uniform_int(0, 1) ? c.s.D : dims[rng.uniform_int(0, 5)];
  Mask& m = c.options.mask;
  auto pick = [&] { return all_masks || rng.uniform_int(0, 2) == 0; };
  if (pick()) m.causal = rng.uniform_int(0, 1) ? CausalAlign::top_left : CausalAlign::bottom_right;
  if (pick()) m.window = Window{rng.uniform_int(-1, 6), rng.uniform_int(-1, 6)};
  if (pick())
    for (int64_t b = 0; b < c.s.B; ++b) m.key_lengths.push_back(rng.uniform_int(0, c.s.M));
  if (pick())
    for (int64_t b = 0; b < c.s.B; ++b) m.query_lengths.push_back(rng.uniform_int(0, c.s.N));
  if (pick()) {
    // Broadcast over heads (stride 0), as callers do.
    c.keep = Tensor<uint8_t>({c.s.B, 1, c.s.N, c.s.M});
    for (int64_t i = 0; i < c.keep.numel(); ++i) c.keep[i] = rng.uniform_int(0, 4) != 0;
    m.keep = broadcast_mask(c.keep.cview(), c.s.B, c.s.H, c.s.N, c.s.M, "keep");
  }
  if (pick()) {
    c.bias = Tensor<float>({c.s.H, c.s.N, c.s.M});
    for (int64_t i = 0; i < c.bias.numel(); ++i)
      c.bias[i] = static_cast<float>(std::ldexp(rng.uniform_int(-256, 256), -8));
    m.bias = broadcast_mask(c.bias.cview(), c.s.B, c.s.H, c.s.N, c.s.M, "bias");
  }
  if (pick())
    for (int64_t h = 0; h < c.s.H; ++h) m.alibi_slopes.push_back(static_cast<float>(rng.uniform(0.0, 0.5)));
  if (pick()) m.softcap = static_cast<float>(rng.uniform(1.0, 5.0));
  if (rng.uniform_int(0, 3) == 0) c.options.scale = rng.uniform(0.05, 1.0);
  return c;
}

std::array<int64_t, 4> dims4(int64_t a, int64_t b, int64_t c, int64_t d) { return {a, b, c, d}; }

// A float64 tensor and, optionally, a view of it with permuted strides (so kernels see odd
// layouts): storage [B, T, H, X] seen as [B, H, T, X].
struct Operand {
  Tensor<double> storage;
  TensorView<double> view;
};
Operand make_operand(test::Rng& rng, int64_t B, int64_t H, int64_t T, int64_t X, bool permuted) {
  Operand o;
  if (permuted) {
    o.storage = rng.normal64({B, T, H, X});
    o.view = o.storage.view().transposed(1, 2);
  } else {
    o.storage = rng.normal64({B, H, T, X});
    o.view = o.storage.view();
  }
  return o;
}

// sum(dout ∘ attention(q, k, v)) in float64: the loss whose gradient the backward computes.
double loss(const Case& c, TensorView<const double> dout, TensorView<const double> q, TensorView<const double> k,
            TensorView<const double> v) {
  Tensor<double> out({c.s.B, c.s.H, c.s.N, c.s.Dv});
  reference_attention_forward(out.view(), {}, {}, q, k, v, c.options);
  double sum = 0.0;
  for (int64_t b = 0; b < c.s.B; ++b)
    for (int64_t h = 0; h < c.s.H; ++h)
      for (int64_t i = 0; i < c.s.N; ++i)
        for (int64_t e = 0; e < c.s.Dv; ++e) sum += dout(b, h, i, e) * out.view()(b, h, i, e);
  return sum;
}

// Fourth-order central difference of f at *x, restoring *x afterwards.
template <class T>
double derivative(T* x, double h, const std::function<double()>& f) {
  const T x0 = *x;
  auto at = [&](double delta) {
    *x = static_cast<T>(x0 + delta);
    return f();
  };
  const double d = (8.0 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12.0 * h);
  *x = x0;
  return d;
}

TEST(Backward, ReferenceMatchesFiniteDifferences) {
  test::Rng rng("Backward.ReferenceFiniteDifferences");
  for (int trial = 0; trial < 30; ++trial) {
    Case c = random_case(rng, 6, trial % 3 == 0);
    const AttentionShape& s = c.s;
    Tensor<double> q = rng.normal64({s.B, s.H, s.N, s.D}), k = rng.normal64({s.B, s.Hkv, s.M, s.D});
    Tensor<double> v = rng.normal64({s.B, s.Hkv, s.M, s.Dv}), dout = rng.normal64({s.B, s.H, s.N, s.Dv});
    Tensor<double> dq({s.B, s.H, s.N, s.D}), dk({s.B, s.Hkv, s.M, s.D}), dv({s.B, s.Hkv, s.M, s.Dv});
    Tensor<double> dbias({s.B, s.H, s.N, s.M});
    reference_attention_backward(dq.view(), dk.view(), dv.view(), dbias.view(), dout.cview(), q.cview(), k.cview(),
                                 v.cview(), c.options);
    auto f = [&] { return loss(c, dout.cview(), q.cview(), k.cview(), v.cview()); };
    for (auto [name, x, g] : {std::tuple{"dq", &q, &dq}, std::tuple{"dk", &k, &dk}, std::tuple{"dv", &v, &dv}}) {
      const double scale = std::max(1e-3, max_abs(g->cview()));
      for (int64_t i = 0; i < x->numel(); ++i) {
        const double fd = derivative(x->data() + i, 1e-3, f);
        ASSERT_LE(std::abs(fd - (*g)[i]) / scale, 1e-6) << name << "[" << i << "] " << c.describe();
      }
    }
    // The bias is float: steps of 2^-10 keep bias ± step exact (entries are multiples of 2^-8).
    if (c.bias.rank() > 0) {
      Tensor<double> dsum({s.H, s.N, s.M});  // the bias broadcasts over B, so its gradient sums over B
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t i = 0; i < dsum.numel(); ++i) dsum[i] += dbias[b * dsum.numel() + i];
      const double scale = std::max(1e-3, max_abs(dsum.cview()));
      for (int64_t i = 0; i < c.bias.numel(); ++i) {
        const double fd = derivative(c.bias.data() + i, std::ldexp(1.0, -10), f);
        ASSERT_LE(std::abs(fd - dsum[i]) / scale, 1e-6) << "dbias[" << i << "] " << c.describe();
      }
    }
  }
}

// The fp32 kernel on float copies of the inputs against the float64 reference on the same values.
void compare_fp32_with_reference(test::Rng& rng, const Case& c, int trial, Simd simd = Simd::automatic) {
  const AttentionShape& s = c.s;
  auto coin = [&] { return rng.uniform_int(0, 1) == 1; };
  Operand q = make_operand(rng, s.B, s.H, s.N, s.D, coin()), k = make_operand(rng, s.B, s.Hkv, s.M, s.D, coin());
  Operand v = make_operand(rng, s.B, s.Hkv, s.M, s.Dv, coin()), dout = make_operand(rng, s.B, s.H, s.N, s.Dv, coin());
  Tensor<float> q32 = to_contiguous<float>(q.view), k32 = to_contiguous<float>(k.view);
  Tensor<float> v32 = to_contiguous<float>(v.view), dout32 = to_contiguous<float>(dout.view);
  Tensor<double> q64 = to_contiguous<double>(q32.cview()), k64 = to_contiguous<double>(k32.cview());
  Tensor<double> v64 = to_contiguous<double>(v32.cview()), dout64 = to_contiguous<double>(dout32.cview());

  Tensor<float> out({s.B, s.H, s.N, s.Dv}), lse({s.B, s.H, s.N});
  AttentionOptions options = c.options;
  options.simd = simd;
  options.num_threads = static_cast<int>(rng.uniform_int(1, 3));
  attention_forward(out.view(), lse.view(), q32.cview(), k32.cview(), v32.cview(), options);
  // Outputs in [B, T, H, X] storage seen as [B, H, T, X]: the kernel must honour output strides.
  Tensor<float> dq_store({s.B, s.N, s.H, s.D}), dk({s.B, s.Hkv, s.M, s.D}), dv({s.B, s.Hkv, s.M, s.Dv});
  Tensor<float> dbias({s.B, s.H, s.N, s.M});
  const bool want_bias = coin();
  attention_backward(dq_store.view().transposed(1, 2), dk.view(), dv.view(),
                     want_bias ? dbias.view() : TensorView<float>{}, dout32.cview(), q32.cview(), k32.cview(),
                     v32.cview(), out.cview(), lse.cview(), options);
  Tensor<double> rq({s.B, s.H, s.N, s.D}), rk({s.B, s.Hkv, s.M, s.D}), rv({s.B, s.Hkv, s.M, s.Dv});
  Tensor<double> rbias({s.B, s.H, s.N, s.M});
  reference_attention_backward(rq.view(), rk.view(), rv.view(), rbias.view(), dout64.cview(), q64.cview(), k64.cview(),
                               v64.cview(), c.options);
  // Error relative to max |grad|, floored at 0.1: when every allowed key set is a single key, the
  // exact gradient is 0 by cancellation (dP - D) and fp32 leaves ~1e-6 of rounding there.
  auto check = [&](const char* name, TensorView<const float> got, TensorView<const double> want) {
    const double scale = std::max(0.1, max_abs(want));
    double worst = 0.0;
    std::string where;
    const TensorView<const float> g4 = got.as_rank4();
    const TensorView<const double> w4 = want.as_rank4();
    for (int64_t a = 0; a < w4.dim(0); ++a)
      for (int64_t b = 0; b < w4.dim(1); ++b)
        for (int64_t i = 0; i < w4.dim(2); ++i)
          for (int64_t j = 0; j < w4.dim(3); ++j) {
            const double g = g4(a, b, i, j);
            ASSERT_FALSE(std::isnan(g)) << name << " trial " << trial << " " << simd_path_name(simd) << " "
                                        << c.describe();
            const double err = std::abs(g - w4(a, b, i, j)) / scale;
            if (err > worst) where = fmt::format("at [{}, {}, {}, {}]: {} vs {}", a, b, i, j, g, w4(a, b, i, j));
            worst = std::max(worst, err);
          }
    EXPECT_LE(worst, 2e-4) << name << " trial " << trial << " " << simd_path_name(simd) << " " << c.describe()
                           << " worst " << where;
  };
  check("dq", TensorView<const float>(dq_store.view().transposed(1, 2)), rq.cview());
  check("dk", dk.cview(), rk.cview());
  check("dv", dv.cview(), rv.cview());
  if (want_bias) check("dbias", dbias.cview(), rbias.cview());
}

TEST(Backward, Fp32MatchesReferenceOnRandomCases) {
  test::Rng rng("Backward.Fp32MatchesReference");
  for (int trial = 0; trial < 150; ++trial) {
    // Mostly small cases, some spanning several 64-row tiles.
    const Case c = random_case(rng, trial % 5 == 0 ? 150 : 12, trial % 7 == 0);
    compare_fp32_with_reference(rng, c, trial);
    if (HasFailure()) return;
  }
}

// 80 random cases on each SIMD path, forced in turn (the test above runs the automatic one).
TEST(Backward, Fp32MatchesReferenceOnEverySimdPath) {
  test::Rng rng("Backward.EverySimdPath");
  for (Simd simd : test::available_paths()) {
    for (int trial = 0; trial < 80; ++trial) {
      const Case c = random_case(rng, trial % 4 == 0 ? 150 : 12, trial % 7 == 0);
      compare_fp32_with_reference(rng, c, trial, simd);
      if (HasFailure()) return;
    }
  }
}

// Long rows with one kv head: the kernel splits the queries into 4 chunks whose partial dk, dv
// are summed afterwards; head dims 64 and 128 take the micro-kernel's fixed-K instantiations.
// Chunks whose rows see different keys (windows, key lengths per batch row, a chunk that sees
// none): each sums only its own keys, and the others' sums of those keys are zeros.
TEST(Backward, Fp32MatchesReferenceAcrossQueryChunksOnEverySimdPath) {
  test::Rng rng("Backward.QueryChunks");
  int trial = 0;
  for (Simd simd : test::available_paths()) {
    for (int64_t d : {64, 128}) {
      for (int variant = 0; variant < 4; ++variant) {
        Case c;
        const int64_t B = variant == 3 ? 2 : 1, M = 200 + rng.uniform_int(0, 100);
        c.s = AttentionShape{B, 2, 1, 300 + rng.uniform_int(0, 40), M, d, d};
        Mask& m = c.options.mask;
        if (variant == 0 && trial % 2 == 0) m.causal = CausalAlign::bottom_right;
        if (variant == 1) m.causal = CausalAlign::top_left, m.window = Window{rng.uniform_int(0, 70), 0};
        if (variant == 2) m.window = Window{rng.uniform_int(0, 40), rng.uniform_int(0, 40)};
        if (variant == 3) m.causal = CausalAlign::bottom_right, m.key_lengths = {rng.uniform_int(0, M), M};
        compare_fp32_with_reference(rng, c, trial++, simd);
        if (HasFailure()) return;
      }
    }
  }
}

struct Grads {
  Tensor<float> dq, dk, dv, dbias;
};

Grads run_fp32(const Case& c, const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
               const Tensor<float>& dout, int threads, Simd simd = Simd::automatic) {
  const AttentionShape& s = c.s;
  AttentionOptions options = c.options;
  options.num_threads = threads;
  options.simd = simd;
  Tensor<float> out({s.B, s.H, s.N, s.Dv}), lse({s.B, s.H, s.N});
  attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
  Grads g{Tensor<float>({s.B, s.H, s.N, s.D}), Tensor<float>({s.B, s.Hkv, s.M, s.D}),
          Tensor<float>({s.B, s.Hkv, s.M, s.Dv}), Tensor<float>({s.B, s.H, s.N, s.M})};
  attention_backward(g.dq.view(), g.dk.view(), g.dv.view(), g.dbias.view(), dout.cview(), q.cview(), k.cview(),
                     v.cview(), out.cview(), lse.cview(), options);
  return g;
}

// Kernel::reference is honoured (it used to be ignored): the float64 oracle, each gradient rounded once.
TEST(Backward, ReferenceKernelIsTheRoundedOracle) {
  test::Rng rng("Backward.ReferenceKernel");
  for (int trial = 0; trial < 20; ++trial) {
    Case c = random_case(rng, 12);
    const AttentionShape& s = c.s;
    Tensor<float> q = rng.normal32(dims4(s.B, s.H, s.N, s.D)), k = rng.normal32(dims4(s.B, s.Hkv, s.M, s.D));
    Tensor<float> v = rng.normal32(dims4(s.B, s.Hkv, s.M, s.Dv)), dout = rng.normal32(dims4(s.B, s.H, s.N, s.Dv));
    c.options.kernel = Kernel::reference;
    const Grads got = run_fp32(c, q, k, v, dout, 2);
    const Tensor<double> q64 = to_contiguous<double>(q.cview()), k64 = to_contiguous<double>(k.cview()),
                         v64 = to_contiguous<double>(v.cview()), dout64 = to_contiguous<double>(dout.cview());
    Tensor<double> dq({s.B, s.H, s.N, s.D}), dk({s.B, s.Hkv, s.M, s.D}), dv({s.B, s.Hkv, s.M, s.Dv}),
        dbias({s.B, s.H, s.N, s.M});
    reference_attention_backward(dq.view(), dk.view(), dv.view(), dbias.view(), dout64.cview(), q64.cview(),
                                 k64.cview(), v64.cview(), c.options);
    for (auto [g, want] :
         {std::pair{&got.dq, &dq}, std::pair{&got.dk, &dk}, std::pair{&got.dv, &dv}, std::pair{&got.dbias, &dbias}})
      for (int64_t i = 0; i < g->numel(); ++i)
        ASSERT_EQ((*g)[i], static_cast<float>((*want)[i])) << "element " << i << ", " << c.describe();
  }
}

// Several query chunks (N > 128 with B·Hkv < 4), key tiles and tile edges, on every path.
TEST(Backward, BitwiseEqualForOneTwoThreeThreadsOnEverySimdPath) {
  test::Rng rng("Backward.ThreadDeterminism");
  for (int trial = 0; trial < 4 * static_cast<int>(test::available_paths().size()); ++trial) {
    const Simd simd = test::available_paths()[trial / 4];
    Case c = random_case(rng, 40, trial % 4 == 0);
    c.s.N = 130 + trial % 4 * 70;  // 3 to 6 query tiles
    c.s.M = 200 - trial % 4;
    c.options.mask.key_lengths.clear();
    c.options.mask.query_lengths.clear();
    c.options.mask.keep = {};
    c.options.mask.bias = {};
    const AttentionShape& s = c.s;
    if (!c.options.mask.alibi_slopes.empty()) c.options.mask.alibi_slopes.assign(s.H, 0.1f);
    Tensor<float> q = rng.normal32(dims4(s.B, s.H, s.N, s.D)), k = rng.normal32(dims4(s.B, s.Hkv, s.M, s.D));
    Tensor<float> v = rng.normal32(dims4(s.B, s.Hkv, s.M, s.Dv)), dout = rng.normal32(dims4(s.B, s.H, s.N, s.Dv));
    const Grads one = run_fp32(c, q, k, v, dout, 1, simd);
    for (int threads : {2, 3, 100000}) {  // 100000: capped (resolve_num_threads), not a crash
      const Grads many = run_fp32(c, q, k, v, dout, threads, simd);
      for (auto [a, b] : {std::pair{&one.dq, &many.dq}, std::pair{&one.dk, &many.dk}, std::pair{&one.dv, &many.dv},
                          std::pair{&one.dbias, &many.dbias}})
        ASSERT_EQ(0, std::memcmp(a->data(), b->data(), a->numel() * sizeof(float)))
            << threads << " threads, " << simd_path_name(simd) << ", " << c.describe();
    }
  }
}

// Each thread keeps its scratch across calls: a call after others of larger shapes, large scores
// and every mask (which fill more of it, with other paddings) gives bitwise what it gave first.
TEST(Backward, ScratchKeptAcrossCallsLeavesNoTrace) {
  test::Rng rng("Backward.ScratchAcrossCalls");
  for (Simd simd : test::available_paths()) {
    Case small = random_case(rng, 40);
    small.s.D = 3, small.s.Dv = 17;
    Tensor<float> q = rng.normal32(dims4(small.s.B, small.s.H, small.s.N, small.s.D));
    Tensor<float> k = rng.normal32(dims4(small.s.B, small.s.Hkv, small.s.M, small.s.D));
    Tensor<float> v = rng.normal32(dims4(small.s.B, small.s.Hkv, small.s.M, small.s.Dv));
    Tensor<float> dout = rng.normal32(dims4(small.s.B, small.s.H, small.s.N, small.s.Dv));
    for (int threads : {1, 2}) {
      const Grads first = run_fp32(small, q, k, v, dout, threads, simd);
      for (int i = 0; i < 2; ++i) {
        Case big = random_case(rng, 300, true);
        big.s.D = 111, big.s.Dv = 59;
        big.options.mask.key_lengths.clear();
        big.options.mask.query_lengths.clear();
        big.options.mask.keep = {};
        big.options.mask.bias = {};
        if (!big.options.mask.alibi_slopes.empty()) big.options.mask.alibi_slopes.assign(big.s.H, 0.1f);
        Tensor<float> bq = rng.normal32(dims4(big.s.B, big.s.H, big.s.N, big.s.D));
        for (int64_t e = 0; e < bq.numel(); ++e) bq[e] *= 50.0f;  // large scores: the refined paths' buffers
        run_fp32(big, bq, rng.normal32(dims4(big.s.B, big.s.Hkv, big.s.M, big.s.D)),
                 rng.normal32(dims4(big.s.B, big.s.Hkv, big.s.M, big.s.Dv)),
                 rng.normal32(dims4(big.s.B, big.s.H, big.s.N, big.s.Dv)), threads, simd);
      }
      const Grads again = run_fp32(small, q, k, v, dout, threads, simd);
      for (auto [a, b] : {std::pair{&first.dq, &again.dq}, std::pair{&first.dk, &again.dk},
                          std::pair{&first.dv, &again.dv}, std::pair{&first.dbias, &again.dbias}})
        ASSERT_EQ(0, std::memcmp(a->data(), b->data(), a->numel() * sizeof(float)))
            << threads << " threads, " << simd_path_name(simd) << ", " << small.describe();
    }
  }
}

// A call over many keys needs tens of MB of scratch (dk and dv sums of M · D floats); the thread
// keeps at most 8 MB of it between calls.
TEST(Backward, LargeScratchIsNotKeptAfterTheCall) {
  test::Rng rng("Backward.LargeScratch");
  Case c;
  c.s = AttentionShape{1, 1, 1, 8, 40000, 128, 128};
  const AttentionShape& s = c.s;
  Tensor<float> q = rng.normal32(dims4(s.B, s.H, s.N, s.D)), k = rng.normal32(dims4(s.B, s.Hkv, s.M, s.D));
  Tensor<float> v = rng.normal32(dims4(s.B, s.Hkv, s.M, s.Dv)), dout = rng.normal32(dims4(s.B, s.H, s.N, s.Dv));
  AttentionOptions options;
  options.num_threads = 1;  // other threads' allocations would not show in the main arena
  Tensor<float> out({s.B, s.H, s.N, s.Dv}), lse({s.B, s.H, s.N});
  attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
  Tensor<float> dq(dims4(s.B, s.H, s.N, s.D)), dk(dims4(s.B, s.Hkv, s.M, s.D)), dv(dims4(s.B, s.Hkv, s.M, s.Dv));
  const struct mallinfo2 m0 = mallinfo2();
  attention_backward(dq.view(), dk.view(), dv.view(), {}, dout.cview(), q.cview(), k.cview(), v.cview(), out.cview(),
                     lse.cview(), options);
  const struct mallinfo2 m1 = mallinfo2();
  const int64_t grew = static_cast<int64_t>((m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd));
  EXPECT_LE(grew, 8 << 20) << "the call's scratch held 40000 keys' dk and dv sums (40 MB)";
}

TEST(Backward, FullyMaskedRowsGiveZeroGradients) {
  test::Rng rng("Backward.FullyMaskedRows");
  Case c;
  c.s = AttentionShape{2, 2, 1, 5, 4, 3, 6};
  const AttentionShape& s = c.s;
  c.options.mask.key_lengths = {0, 4};    // batch 0: no keys at all
  c.options.mask.query_lengths = {5, 3};  // batch 1: rows 3, 4 masked
  c.keep = Tensor<uint8_t>({1, 1, s.N, s.M});
  for (int64_t i = 0; i < c.keep.numel(); ++i) c.keep[i] = i >= s.M;  // row 0 has no kept key
  c.options.mask.keep = broadcast_mask(c.keep.cview(), s.B, s.H, s.N, s.M, "keep");
  Tensor<float> q = rng.normal32(dims4(s.B, s.H, s.N, s.D)), k = rng.normal32(dims4(s.B, s.Hkv, s.M, s.D));
  Tensor<float> v = rng.normal32(dims4(s.B, s.Hkv, s.M, s.Dv)), dout = rng.normal32(dims4(s.B, s.H, s.N, s.Dv));
  for (Simd simd : test::available_paths()) {
    SCOPED_TRACE(simd_path_name(simd));
    const Grads g = run_fp32(c, q, k, v, dout, 2, simd);
    for (int64_t i = 0; i < g.dq.numel(); ++i) ASSERT_FALSE(std::isnan(g.dq[i]));
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t i = 0; i < s.N; ++i) {
        const bool dead1 = i == 0 || i >= 3;
        for (int64_t d = 0; d < s.D; ++d) {
          EXPECT_EQ(g.dq.view()(0, h, i, d), 0.0f);
          if (dead1) {
            EXPECT_EQ(g.dq.view()(1, h, i, d), 0.0f);
          } else {
            EXPECT_NE(g.dq.view()(1, h, i, d), 0.0f);
          }
        }
        for (int64_t j = 0; j < s.M; ++j) {
          EXPECT_EQ(g.dbias.view()(0, h, i, j), 0.0f);
          if (dead1) {
            EXPECT_EQ(g.dbias.view()(1, h, i, j), 0.0f);
          }
        }
      }
    }
    for (int64_t j = 0; j < s.M; ++j) {
      for (int64_t d = 0; d < s.D; ++d) EXPECT_EQ(g.dk.view()(0, 0, j, d), 0.0f);
      for (int64_t e = 0; e < s.Dv; ++e) EXPECT_EQ(g.dv.view()(0, 0, j, e), 0.0f);
    }
  }
}

// Softmax over a single allowed key is the constant 1, so dq and dk are exactly 0 (not rounding
// noise), on every path: one key in all (M = 1), and a zero-width window (the diagonal key only).
TEST(Backward, SingleKeyRowsGiveExactlyZeroQueryAndKeyGradients) {
  test::Rng rng("Backward.SingleKeyRows");
  for (Simd simd : test::available_paths()) {
    for (int variant = 0; variant < 2; ++variant) {
      Case c;
      c.s = variant == 0 ? AttentionShape{1, 3, 1, 70, 1, 59, 111} : AttentionShape{2, 2, 2, 70, 70, 40, 17};
      if (variant == 1) c.options.mask.window = Window{0, 0};
      c.options.mask.alibi_slopes.assign(static_cast<std::size_t>(c.s.H), 0.4f);
      c.options.scale = 0.8;
      const AttentionShape& s = c.s;
      Tensor<float> q = rng.normal32(dims4(s.B, s.H, s.N, s.D)), k = rng.normal32(dims4(s.B, s.Hkv, s.M, s.D));
      Tensor<float> v = rng.normal32(dims4(s.B, s.Hkv, s.M, s.Dv)), dout = rng.normal32(dims4(s.B, s.H, s.N, s.Dv));
      const Grads g = run_fp32(c, q, k, v, dout, 2, simd);
      for (int64_t i = 0; i < g.dq.numel(); ++i)
        ASSERT_EQ(g.dq[i], 0.0f) << simd_path_name(simd) << " " << c.describe();
      for (int64_t i = 0; i < g.dk.numel(); ++i)
        ASSERT_EQ(g.dk[i], 0.0f) << simd_path_name(simd) << " " << c.describe();
      double dv_norm = 0.0;
      for (int64_t i = 0; i < g.dv.numel(); ++i) dv_norm += std::abs(g.dv[i]);
      EXPECT_GT(dv_norm, 0.0) << simd_path_name(simd) << " " << c.describe();
    }
  }
}

// A gradient past fp32's range from finite inputs is refused, as the forward refuses its output:
// dout·v past 3.4e38 (v and dout ~1e36, D = 2) came back as inf and NaN gradients without an
// error, from the fused kernels and from Kernel::reference (whose float64 gradients, ~1e72, round
// to inf). Shapes with one and several query chunks (N = 200 sums partials), GQA, dbias on and
// off, 1 and 2 threads. A NaN in dout or in out explains a NaN gradient: not refused.
TEST(Backward, Fp32RefusesAGradientOverflowFromFiniteInputs) {
  test::Rng rng("Backward.Fp32Overflow");
  const std::string message =
      "attention_backward: the gradients overflowed float32 although q, k, v and dout are finite";
  for (const int64_t N : {3, 200})
    for (const int64_t Hkv : {1, 2}) {
      Case c;
      c.s = AttentionShape{.B = 1, .H = 2, .Hkv = Hkv, .N = N, .M = N, .D = 4, .Dv = 2};
      const AttentionShape& s = c.s;
      Tensor<float> q = rng.normal32(dims4(1, 2, N, 4)), k = rng.normal32(dims4(1, Hkv, N, 4));
      Tensor<float> v = rng.normal32(dims4(1, Hkv, N, 2)), dout = rng.normal32(dims4(1, 2, N, 2));
      for (int64_t i = 0; i < v.numel(); ++i) v[i] *= 1e36f;
      for (int64_t i = 0; i < dout.numel(); ++i) dout[i] *= 1e36f;
      std::vector<std::pair<Kernel, Simd>> kernels{{Kernel::reference, Simd::automatic}};
      for (Simd simd : test::available_paths()) kernels.emplace_back(Kernel::fused, simd);
      for (const std::pair<Kernel, Simd>& path : kernels)
        for (const int threads : {1, 2}) {
          const Kernel kernel = path.first;  // not structured bindings: clang 14 cannot capture them
          const Simd simd = path.second;
          c.options.kernel = kernel;
          const std::string where =
              fmt::format("{} {} threads={} N={} Hkv={}", kernel == Kernel::reference ? "reference" : "fused",
                          simd_path_name(simd), threads, N, Hkv);
          SCOPED_TRACE(where);
          test::expect_error([&] { run_fp32(c, q, k, v, dout, threads, simd); }, {message, "Kernel::reference"});
          // Without dbias, through the float64 lse too.
          AttentionOptions options = c.options;
          options.num_threads = threads, options.simd = simd;
          Tensor<float> out({1, 2, N, 2}), dq({1, 2, N, 4}), dk({1, Hkv, N, 4}), dv({1, Hkv, N, 2});
          Tensor<double> lse({1, 2, N});
          attention_forward_lse64(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
          auto backward = [&](const Tensor<float>& d, const Tensor<float>& o) {
            attention_backward(dq.view(), dk.view(), dv.view(), {}, d.cview(), q.cview(), k.cview(), v.cview(),
                               o.cview(), lse.cview(), options);
          };
          test::expect_error([&] { backward(dout, out); }, {message});
          Tensor<float> nan_dout = to_contiguous<float>(dout.cview()), nan_out = to_contiguous<float>(out.cview());
          nan_dout[1] = std::nanf("");
          nan_out[s.Dv] = std::nanf("");
          EXPECT_NO_THROW(backward(nan_dout, out));
          if (kernel == Kernel::fused) {  // the reference reads no out
            EXPECT_NO_THROW(backward(dout, nan_out));
          }
        }
    }
  // An lse of +inf, which no forward returns, is refused as such, not called an overflow of finite
  // inputs with the advice to scale them down.
  Tensor<float> q = rng.normal32(dims4(1, 2, 3, 4)), k = rng.normal32(dims4(1, 2, 5, 4));
  Tensor<float> v = rng.normal32(dims4(1, 2, 5, 4)), dout = rng.normal32(dims4(1, 2, 3, 4));
  Tensor<float> out({1, 2, 3, 4}), lse({1, 2, 3}), dq({1, 2, 3, 4}), dk({1, 2, 5, 4}), dv({1, 2, 5, 4});
  attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview());
  lse[0] = std::numeric_limits<float>::infinity();
  test::expect_error(
      [&] {
        attention_backward(dq.view(), dk.view(), dv.view(), {}, dout.cview(), q.cview(), k.cview(), v.cview(),
                           out.cview(), lse.cview());
      },
      {"attention_backward: lse[0, 0, 0] (batch, head, query row) is +inf although q, k and v are finite"});
}

TEST(Backward, RefusesBadShapes) {
  test::Rng rng("Backward.BadShapes");
  Tensor<float> q = rng.normal32(dims4(1, 2, 3, 4)), k = rng.normal32(dims4(1, 2, 5, 4)),
                v = rng.normal32(dims4(1, 2, 5, 4));
  Tensor<float> out({1, 2, 3, 4}), lse({1, 2, 3}), dq({1, 2, 3, 4}), dk({1, 2, 5, 4}), dv({1, 2, 5, 4});
  Tensor<float> bad({1, 2, 3, 5}), dbias({1, 1, 3, 5});
  auto expect = [](const std::function<void()>& f, const std::string& needle) { test::expect_error(f, {needle}); };
  expect(
      [&] {
        attention_backward(bad.view(), dk.view(), dv.view(), {}, out.cview(), q.cview(), k.cview(), v.cview(),
                           out.cview(), lse.cview());
      },
      "dq: shape [1, 2, 3, 5] must be [1, 2, 3, 4]");
  expect(
      [&] {
        attention_backward(dq.view(), dk.view(), dv.view(), {}, bad.cview(), q.cview(), k.cview(), v.cview(),
                           out.cview(), lse.cview());
      },
      "dout: shape [1, 2, 3, 5] must be [1, 2, 3, 4]");
  const std::array<int64_t, 4> shape{1, 2, 3, 5}, strides{15, 0, 5, 1};
  const TensorView<float> broadcast(dbias.data(), shape, strides);
  expect(
      [&] {
        attention_backward(dq.view(), dk.view(), dv.view(), broadcast, out.cview(), q.cview(), k.cview(), v.cview(),
                           out.cview(), lse.cview());
      },
      "dbias: its strides make elements share memory");
  expect(
      [&] {
        attention_backward(dq.view(), dk.view(), dv.view(), {}, out.cview(), q.cview(), k.cview(), v.cview(),
                           out.cview(), out.cview());
      },
      "lse: shape [1, 2, 3, 4] must be [1, 2, 3]");
}

}  // namespace
}  // namespace qkv
