// Attention dropout: the generator, the keep rate, the fused forward and backward against the
// float64 reference given the same mask (and the backward against PyTorch's fp32 composite by
// FlashAttention's rule), the same bits for any thread count, and unbiasedness.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "attention_cases.h"
#include "composite32.h"
#include "qkv/attention.h"
#include "qkv/backward.h"
#include "qkv/dropout.h"
#include "qkv/error.h"
#include "qkv/reference.h"
#include "test_util.h"

namespace qkv {
namespace {

// Random123's known-answer vectors for Philox4x32-10 (kat_vectors).
TEST(Dropout, PhiloxKnownAnswers) {
  using W = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}), (W{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (W{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (W{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// The keep rate is 1 − p within 5 standard deviations over 10^6 weights, and masks of different
// seeds, offsets, heads and rows agree only as independent masks do (p² + (1 − p)²).
TEST(Dropout, KeepRateAndIndependence) {
  test::Rng rng("Dropout.KeepRate");
  for (double p : {0.1, 0.5, 0.9}) {
    const Dropout d{p, rng.engine()(), static_cast<uint64_t>(rng.uniform_int(0, 1000))};
    const int64_t H = 4, N = 500, M = 500;
    int64_t kept = 0, same_seed = 0, same_offset = 0, same_head = 0;
    Dropout other_seed = d, other_offset = d;
    other_seed.seed ^= 1;
    other_offset.offset += 1;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        const DropoutRow row(d, H, 0, h, i), a(other_seed, H, 0, h, i), b(other_offset, H, 0, h, i),
            c(d, H, 0, (h + 1) % H, i);
        for (int64_t j = 0; j < M; ++j) {
          const bool k = row.keep(j);
          kept += k;
          same_seed += k == a.keep(j), same_offset += k == b.keep(j), same_head += k == c.keep(j);
        }
      }
    const double n = H * N * M, sd = std::sqrt(n * p * (1 - p));
    EXPECT_LE(std::abs(kept - n * (1 - p)), 5 * sd) << "p = " << p << ", seed " << d.seed;
    const double agree = p * p + (1 - p) * (1 - p), sd2 = std::sqrt(n * agree * (1 - agree));
    for (int64_t same : {same_seed, same_offset, same_head})
      EXPECT_LE(std::abs(same - n * agree), 5 * sd2) << "p = " << p << ", seed " << d.seed;
  }
}

TEST(Dropout, RefusesAProbabilityOutsideZeroToOne) {
  Tensor<float> q({1, 1, 3, 4}), out({1, 1, 3, 4});
  for (double p : {1.0, -0.1, 1.5, std::nan("")}) {
    AttentionOptions o;
    o.dropout.p = p;
    try {
      attention_forward(out.view(), {}, q.cview(), q.cview(), q.cview(), o);
      ADD_FAILURE() << "dropout_p " << p << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dropout_p must be in [0, 1)"), std::string::npos) << e.what();
    }
  }
}

// The fused forward on every SIMD path against the float64 reference with the same mask, on the
// random problems of the forward's own tests (every mask kind, GQA, odd sizes, strided layouts).
TEST(Dropout, ForwardMatchesTheReferenceWithTheSameMaskOnEveryPath) {
  test::Rng rng("Dropout.Forward");
  for (Simd simd : test::available_paths())
    for (int trial = 0; trial < 60; ++trial) {
      test::Problem p = test::random_problem(rng, 1e6);
      p.options.dropout = Dropout{rng.uniform_int(0, 2) == 0 ? 0.7 : 0.2, rng.engine()(), rng.engine()() >> 40};
      const test::Expected e = test::reference_of(p);
      test::run_fused(p, simd, static_cast<int>(rng.uniform_int(1, 3)));
      const std::string failure = test::compare_to_reference(p, e);
      ASSERT_TRUE(failure.empty()) << simd_path_name(simd) << " trial " << trial << ": " << failure << "; "
                                   << p.describe << " dropout " << p.options.dropout.p << " seed "
                                   << p.options.dropout.seed;
    }
}

float round_bf16(double x) { return bf16_to_float(float_to_bf16(static_cast<float>(x))); }

// The bf16 forward with dropout on every path, by FlashAttention's rule for low precision: against
// the float64 reference on the bf16-rounded inputs, at most twice the error of PyTorch's bf16
// composite (emulated from the reference's weights: logits, softmax and dropout(P) rounded to bf16,
// P·V in fp32 rounded to bf16) plus 1e-5.
TEST(Dropout, Bf16ForwardWithinTheCompositeRuleOnEveryPath) {
  test::Rng rng("Dropout.Bf16");
  for (int trial = 0; trial < 40; ++trial) {
    const AttentionShape s{1, 2, 1, rng.uniform_int(1, 90), rng.uniform_int(1, 90), 64, 64};
    AttentionOptions o;
    o.dropout = Dropout{rng.uniform(0.05, 0.6), rng.engine()(), 0};
    if (rng.uniform_int(0, 1)) o.mask.causal = CausalAlign::bottom_right;
    Tensor<bf16> q({1, 2, s.N, 64}), k({1, 1, s.M, 64}), v({1, 1, s.M, 64});
    for (Tensor<bf16>* t : {&q, &k, &v})
      for (int64_t i = 0; i < t->numel(); ++i) (*t)[i] = float_to_bf16(static_cast<float>(rng.uniform(-2, 2)));
    auto widen = [](const Tensor<bf16>& t) {
      Tensor<double> w(t.shape());
      for (int64_t i = 0; i < t.numel(); ++i) w[i] = bf16_to_float(t[i]);
      return w;
    };
    const Tensor<double> q64 = widen(q), k64 = widen(k), v64 = widen(v);
    Tensor<double> want({1, 2, s.N, 64}), lse({1, 2, s.N}), weights({1, 2, s.N, s.M}), peer({1, 2, s.N, 64});
    reference_attention_forward(want.view(), lse.view(), weights.view(), q64.cview(), k64.cview(), v64.cview(), o);
    const float kept = static_cast<float>(dropout_scale(o.dropout));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < s.N; ++i) {
        std::vector<float> p(static_cast<std::size_t>(s.M));
        float mx = -std::numeric_limits<float>::infinity(), l = 0;
        for (int64_t j = 0; j < s.M; ++j) {
          const double w = weights.cview()(0, h, i, j);
          p[j] = w > 0 ? round_bf16(std::log(w) + lse.cview()(0, h, i)) : -std::numeric_limits<float>::infinity();
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j < s.M; ++j) l += p[j] = std::isinf(mx) ? 0.0f : std::exp(p[j] - mx);
        const DropoutRow row(o.dropout, 2, 0, h, i);
        for (int64_t j = 0; j < s.M; ++j)
          p[j] = l > 0 ? round_bf16(round_bf16(p[j] / l) * (row.keep(j) ? kept : 0.0f)) : 0;
        for (int64_t e = 0; e < 64; ++e) {
          float acc = 0;
          for (int64_t j = 0; j < s.M; ++j) acc += p[j] * static_cast<float>(v64.cview()(0, 0, j, e));
          peer.view()(0, h, i, e) = round_bf16(acc);
        }
      }
    double bound = 0;
    for (int64_t i = 0; i < want.numel(); ++i) bound = std::max(bound, std::abs(peer[i] - want[i]));
    bound = 2 * bound + 1e-5;
    for (Simd simd : test::available_paths()) {
      o.simd = simd;
      Tensor<float> out({1, 2, s.N, 64});
      attention_forward(out.view(), {}, q.cview(), k.cview(), v.cview(), o);
      double err = 0;
      for (int64_t i = 0; i < want.numel(); ++i) err = std::max(err, std::abs(out[i] - want[i]));
      ASSERT_LE(err, bound) << simd_path_name(simd) << " trial " << trial << " N " << s.N << " M " << s.M << " p "
                            << o.dropout.p << " seed " << o.dropout.seed;
    }
  }
}

struct Grads {
  Tensor<float> out;
  Tensor<double> lse;
  Tensor<float> dq, dk, dv;
};

Grads run_both(const AttentionShape& s, const AttentionOptions& options, const Tensor<float>& q, const Tensor<float>& k,
               const Tensor<float>& v, const Tensor<float>& dout) {
  Grads r{Tensor<float>({s.B, s.H, s.N, s.Dv}), Tensor<double>({s.B, s.H, s.N}), Tensor<float>({s.B, s.H, s.N, s.D}),
          Tensor<float>({s.B, s.Hkv, s.M, s.D}), Tensor<float>({s.B, s.Hkv, s.M, s.Dv})};
  // lse in float64, as qkv.torch keeps it: its fp32 rounding alone puts ~5e-7 into each recomputed
  // P at scores of q·50, which dropout's 1 / (1 − p) then carries into dv.
  attention_forward_lse64(r.out.view(), r.lse.view(), q.cview(), k.cview(), v.cview(), options);
  attention_backward(r.dq.view(), r.dk.view(), r.dv.view(), {}, dout.cview(), q.cview(), k.cview(), v.cview(),
                     r.out.cview(), r.lse.cview(), options);
  return r;
}

double max_diff(const Tensor<float>& a, const Tensor<double>& ref) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(double(a[i]) - ref[i]));
  return m;
}

// Gradients with dropout: within FlashAttention's rule of PyTorch's fp32 composite (the same mask)
// against the float64 reference, on every path, with ordinary scores, scores of q·50, causal rows
// and MQA; and the same bits for 1, 2 and 3 threads.
TEST(Dropout, BackwardWithinTheCompositeRuleAndBitwiseForAnyThreadCount) {
  test::Rng rng("Dropout.Backward");
  const AttentionShape shapes[] = {{1, 2, 2, 3, 5, 40, 40},
                                   {2, 3, 1, 70, 65, 59, 59},
                                   {1, 4, 1, 130, 140, 64, 64},
                                   {1, 2, 2, 1, 1, 111, 111},
                                   {1, 2, 1, 200, 200, 128, 128}};
  for (Simd simd : test::available_paths())
    for (const AttentionShape& s : shapes)
      for (bool large : {false, true}) {
        const bool causal = rng.uniform_int(0, 1) == 1;
        AttentionOptions o;
        o.simd = simd;
        o.kernel = Kernel::fused;
        o.dropout = Dropout{rng.uniform(0.05, 0.6), rng.engine()(), 0};
        if (causal) o.mask.causal = CausalAlign::top_left;
        Tensor<float> q = rng.normal32({s.B, s.H, s.N, s.D}), k = rng.normal32({s.B, s.Hkv, s.M, s.D});
        Tensor<float> v = rng.normal32({s.B, s.Hkv, s.M, s.Dv}), dout = rng.normal32({s.B, s.H, s.N, s.Dv});
        if (large)
          for (int64_t i = 0; i < q.numel(); ++i) q[i] *= 50.0f;
        o.num_threads = 1;
        const Grads one = run_both(s, o, q, k, v, dout);
        for (int threads : {2, 3}) {
          o.num_threads = threads;
          const Grads many = run_both(s, o, q, k, v, dout);
          for (auto [a, b] : {std::pair{&one.out, &many.out}, std::pair{&one.dq, &many.dq},
                              std::pair{&one.dk, &many.dk}, std::pair{&one.dv, &many.dv}})
            ASSERT_EQ(0, std::memcmp(a->data(), b->data(), a->numel() * sizeof(float)))
                << threads << " threads, " << simd_path_name(simd);
        }
        const Tensor<double> q64 = to_contiguous<double>(q.cview()), k64 = to_contiguous<double>(k.cview()),
                             v64 = to_contiguous<double>(v.cview()), do64 = to_contiguous<double>(dout.cview());
        Tensor<double> out({s.B, s.H, s.N, s.Dv}), dq({s.B, s.H, s.N, s.D}), dk({s.B, s.Hkv, s.M, s.D}),
            dv({s.B, s.Hkv, s.M, s.Dv});
        reference_attention_forward(out.view(), {}, {}, q64.cview(), k64.cview(), v64.cview(), o);
        reference_attention_backward(dq.view(), dk.view(), dv.view(), {}, do64.cview(), q64.cview(), k64.cview(),
                                     v64.cview(), o);
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
        const test::Composite32 pt = test::composite32(q, k, v, dout, scale, 0.0f, causal, o.dropout);
        const std::string what =
            fmt::format("{} B{} H{} Hkv{} N{} M{} D{} q×{} causal {} p {} seed {}", simd_path_name(simd), s.B, s.H,
                        s.Hkv, s.N, s.M, s.D, large ? 50 : 1, causal, o.dropout.p, o.dropout.seed);
        double max_ref = 0;
        for (int64_t i = 0; i < out.numel(); ++i) max_ref = std::max(max_ref, std::abs(out[i]));
        EXPECT_LE(max_diff(one.out, out), 2e-5 * (1 + max_ref)) << "out " << what;
        for (auto [name, got, peer, ref] :
             {std::tuple{"dq", &one.dq, &pt.dq, &dq}, std::tuple{"dk", &one.dk, &pt.dk, &dk},
              std::tuple{"dv", &one.dv, &pt.dv, &dv}}) {
          // The peer must agree with the oracle on its own (a wrong mask in either shows here).
          double max_ref_grad = 0;
          for (int64_t i = 0; i < ref->numel(); ++i) max_ref_grad = std::max(max_ref_grad, std::abs((*ref)[i]));
          EXPECT_LE(max_diff(*peer, *ref), 1e-3 * (1 + max_ref_grad)) << name << " composite vs reference " << what;
          EXPECT_LE(max_diff(*got, *ref), 2 * max_diff(*peer, *ref) + 1e-5)
              << name << " " << what << ": qkv " << max_diff(*got, *ref) << ", composite " << max_diff(*peer, *ref);
        }
      }
}

// p = 0 is no dropout at all (the same bits), and the mean output over many seeds is the output
// without dropout: every element within 5 standard errors of its sample mean.
TEST(Dropout, ZeroIsOffAndTheMeanOverSeedsIsTheOutputWithoutDropout) {
  test::Rng rng("Dropout.Unbiased");
  const AttentionShape s{1, 2, 1, 7, 9, 5, 5};
  Tensor<float> q = rng.normal32({1, 2, 7, 5}), k = rng.normal32({1, 1, 9, 5}), v = rng.normal32({1, 1, 9, 5});
  AttentionOptions o;
  Tensor<float> plain({1, 2, 7, 5}), zero({1, 2, 7, 5}), out({1, 2, 7, 5});
  attention_forward(plain.view(), {}, q.cview(), k.cview(), v.cview(), o);
  o.dropout = Dropout{0.0, rng.engine()(), 3};
  attention_forward(zero.view(), {}, q.cview(), k.cview(), v.cview(), o);
  ASSERT_EQ(0, std::memcmp(plain.data(), zero.data(), plain.numel() * sizeof(float)));
  constexpr int kRuns = 4000;
  std::vector<double> sum(static_cast<std::size_t>(out.numel())), sq(sum.size());
  o.dropout.p = 0.3;
  for (int n = 0; n < kRuns; ++n) {
    o.dropout.offset = static_cast<uint64_t>(n);
    attention_forward(out.view(), {}, q.cview(), k.cview(), v.cview(), o);
    for (int64_t i = 0; i < out.numel(); ++i) sum[i] += out[i], sq[i] += double(out[i]) * out[i];
  }
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double mean = sum[i] / kRuns, var = sq[i] / kRuns - mean * mean;
    EXPECT_LE(std::abs(mean - plain[i]), 5 * std::sqrt(var / kRuns) + 1e-6)
        << "element " << i << ", seed " << o.dropout.seed;
  }
  (void)s;
}

}  // namespace
}  // namespace qkv
