// Packed variable-length attention: against the float64 reference per sequence (every mask kind
// varlen takes, GQA, dropout, sequences of 0, 1, 3 and 65 rows), equal to the padded call when all
// sequences have one length, the same bits for any thread count, and its refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <array>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "qkv/backward.h"
#include "qkv/error.h"
#include "qkv/reference.h"
#include "qkv/varlen.h"
#include "test_util.h"

namespace qkv {
namespace {

struct Batch {
  std::vector<int64_t> cu_q{0}, cu_k{0};
  Tensor<float> q, k, v, dout;
};

Batch random_batch(test::Rng& rng, int64_t H, int64_t Hkv, int64_t D, bool cross) {
  static const int64_t kLengths[] = {0, 1, 3, 17, 65, 130};
  Batch b;
  const int64_t n = rng.uniform_int(1, 5);
  for (int64_t s = 0; s < n; ++s) {
    const int64_t lq = kLengths[rng.uniform_int(0, 5)];
    b.cu_q.push_back(b.cu_q.back() + lq);
    b.cu_k.push_back(b.cu_k.back() + (cross ? kLengths[rng.uniform_int(0, 5)] : lq));
  }
  b.q = rng.normal32({b.cu_q.back(), H, D});
  b.k = rng.normal32({b.cu_k.back(), Hkv, D});
  b.v = rng.normal32({b.cu_k.back(), Hkv, D});
  b.dout = rng.normal32({b.cu_q.back(), H, D});
  return b;
}

struct Result {
  Tensor<float> out;
  Tensor<double> lse;
  Tensor<float> dq, dk, dv;
};

Result run(const Batch& b, const AttentionOptions& o) {
  const int64_t H = b.q.dim(1), Hkv = b.k.dim(1), D = b.q.dim(2), tq = b.q.dim(0), tk = b.k.dim(0);
  Result r{Tensor<float>({tq, H, D}), Tensor<double>({H, tq}), Tensor<float>({tq, H, D}), Tensor<float>({tk, Hkv, D}),
           Tensor<float>({tk, Hkv, D})};
  varlen_attention_forward(r.out.view(), r.lse.view(), b.q.cview(), b.k.cview(), b.v.cview(), b.cu_q, b.cu_k, o);
  varlen_attention_backward(r.dq.view(), r.dk.view(), r.dv.view(), b.dout.cview(), b.q.cview(), b.k.cview(),
                            b.v.cview(), r.out.cview(), r.lse.cview(), b.cu_q, b.cu_k, o);
  return r;
}

// One sequence's rows of a packed [total, X, D] tensor as a contiguous [1, X, n, D] float64 tensor.
Tensor<double> unpack(const Tensor<float>& t, int64_t r0, int64_t r1) {
  const int64_t X = t.dim(1), D = t.dim(2);
  Tensor<double> out({1, X, r1 - r0, D});
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t x = 0; x < X; ++x)
      for (int64_t d = 0; d < D; ++d) out.view()(0, x, r - r0, d) = t.cview()(r, x, d);
  return out;
}

TEST(Varlen, MatchesTheReferencePerSequenceAndIsBitwiseForAnyThreadCount) {
  test::Rng rng("Varlen.Reference");
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t Hkv = rng.uniform_int(1, 2), H = Hkv * rng.uniform_int(1, 2);
    const int64_t dims[] = {40, 59, 64, 111};
    const int64_t D = dims[rng.uniform_int(0, 3)];
    const Batch b = random_batch(rng, H, Hkv, D, trial % 2 == 1);
    AttentionOptions o;
    Mask& m = o.mask;
    if (rng.uniform_int(0, 1)) m.causal = rng.uniform_int(0, 1) ? CausalAlign::bottom_right : CausalAlign::top_left;
    if (rng.uniform_int(0, 2) == 0) m.window = Window{rng.uniform_int(0, 20), rng.uniform_int(-1, 5)};
    if (rng.uniform_int(0, 2) == 0) m.alibi_slopes.assign(static_cast<std::size_t>(H), 0.25f);
    if (rng.uniform_int(0, 2) == 0) m.softcap = 5.0f;
    if (rng.uniform_int(0, 1)) o.dropout = Dropout{0.3, rng.engine()(), 2, 5};
    o.num_threads = 1;
    const Result one = run(b, o);
    for (int threads : {2, 3}) {
      o.num_threads = threads;
      const Result many = run(b, o);
      for (auto [x, y] : {std::pair{&one.out, &many.out}, std::pair{&one.dq, &many.dq}, std::pair{&one.dk, &many.dk},
                          std::pair{&one.dv, &many.dv}})
        ASSERT_EQ(0, std::memcmp(x->data(), y->data(), x->numel() * sizeof(float))) << threads << " threads";
    }
    const std::string what = fmt::format("trial {} H {} Hkv {} D {} cu_q {} cu_k {} dropout {}", trial, H, Hkv, D,
                                         fmt::join(b.cu_q, ","), fmt::join(b.cu_k, ","), o.dropout.p);
    for (std::size_t s = 0; s + 1 < b.cu_q.size(); ++s) {
      const int64_t q0 = b.cu_q[s], q1 = b.cu_q[s + 1], k0 = b.cu_k[s], k1 = b.cu_k[s + 1];
      if (q1 == q0) continue;
      if (k1 == k0) {
        for (int64_t i = q0; i < q1; ++i)
          for (int64_t h = 0; h < H; ++h) {
            ASSERT_EQ(one.lse.cview()(h, i), -std::numeric_limits<double>::infinity()) << what;
            for (int64_t e = 0; e < D; ++e) ASSERT_EQ(one.out.cview()(i, h, e), 0.0f) << what;
          }
        continue;
      }
      AttentionOptions so = o;
      so.dropout.first_batch = o.dropout.first_batch + static_cast<int64_t>(s);
      const Tensor<double> q = unpack(b.q, q0, q1), k = unpack(b.k, k0, k1), v = unpack(b.v, k0, k1),
                           dout = unpack(b.dout, q0, q1);
      const int64_t n = q1 - q0, mk = k1 - k0;
      Tensor<double> out({1, H, n, D}), lse({1, H, n}), dq({1, H, n, D}), dk({1, Hkv, mk, D}), dv({1, Hkv, mk, D});
      reference_attention_forward(out.view(), lse.view(), {}, q.cview(), k.cview(), v.cview(), so);
      reference_attention_backward(dq.view(), dk.view(), dv.view(), {}, dout.cview(), q.cview(), k.cview(), v.cview(),
                                   so);
      auto max_abs = [](const Tensor<double>& t) {
        double m = 0;
        for (int64_t i = 0; i < t.numel(); ++i) m = std::isfinite(t[i]) ? std::max(m, std::abs(t[i])) : m;
        return m;
      };
      auto check = [&](const char* name, const Tensor<float>& got, int64_t r0, const Tensor<double>& want, double tol) {
        const double bound = tol * std::max(1.0, max_abs(want));
        for (int64_t x = 0; x < want.dim(1); ++x)
          for (int64_t r = 0; r < want.dim(2); ++r)
            for (int64_t e = 0; e < want.dim(3); ++e)
              ASSERT_LE(std::abs(got.cview()(r0 + r, x, e) - want.cview()(0, x, r, e)), bound)
                  << name << " sequence " << s << " row " << r << " " << what;
      };
      check("out", one.out, q0, out, 2e-5);
      check("dq", one.dq, q0, dq, 2e-4);
      check("dk", one.dk, k0, dk, 2e-4);
      check("dv", one.dv, k0, dv, 2e-4);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < n; ++i) {
          const double want = lse.cview()(0, h, i), got = one.lse.cview()(h, q0 + i);
          if (std::isinf(want))
            ASSERT_EQ(got, want) << what;
          else
            ASSERT_LE(std::abs(got - want), 2e-5 * (1 + std::abs(want))) << what;
        }
    }
  }
}

// All sequences of one length: the padded call on [B, H, n, D] computes the same bits (dropout's
// batch rows are the sequences).
TEST(Varlen, EqualsThePaddedCallWhenEverySequenceHasOneLength) {
  test::Rng rng("Varlen.Padded");
  const int64_t B = 3, H = 4, Hkv = 2, n = 37, D = 59;
  Batch b;
  for (int64_t s = 1; s <= B; ++s) b.cu_q.push_back(s * n), b.cu_k.push_back(s * n);
  b.q = rng.normal32({B * n, H, D}), b.k = rng.normal32({B * n, Hkv, D}), b.v = rng.normal32({B * n, Hkv, D});
  b.dout = rng.normal32({B * n, H, D});
  AttentionOptions o;
  o.mask.causal = CausalAlign::top_left;
  o.dropout = Dropout{0.2, 77, 0, 0};
  const Result packed = run(b, o);
  // A packed [B·n, X, D] buffer seen as [B, X, n, D].
  auto view4 = [&](auto* data, int64_t X) {
    using T = std::remove_pointer_t<decltype(data)>;
    const std::array<int64_t, 4> shape{B, X, n, D}, strides{n * X * D, D, X * D, 1};
    return TensorView<T>(data, shape, strides);
  };
  auto as4 = [&](const Tensor<float>& t) { return view4(t.data(), t.dim(1)); };
  Tensor<float> out({B * n, H, D}), dq({B * n, H, D}), dk({B * n, Hkv, D}), dv({B * n, Hkv, D});
  Tensor<double> lse({B, H, n});
  auto out4 = view4(out.data(), H);
  attention_forward_lse64(out4, lse.view(), as4(b.q), as4(b.k), as4(b.v), o);
  attention_backward(view4(dq.data(), H), view4(dk.data(), Hkv), view4(dv.data(), Hkv), {}, as4(b.dout), as4(b.q),
                     as4(b.k), as4(b.v), TensorView<const float>(out4), lse.cview(), o);
  for (auto [x, y] : {std::pair{&packed.out, &out}, std::pair{&packed.dq, &dq}, std::pair{&packed.dk, &dk},
                      std::pair{&packed.dv, &dv}})
    ASSERT_EQ(0, std::memcmp(x->data(), y->data(), x->numel() * sizeof(float)));
  for (int64_t s = 0; s < B; ++s)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(packed.lse.cview()(h, s * n + i), lse.cview()(s, h, i));
}

TEST(Varlen, RefusesBadOffsetsAndPerRowMasks) {
  Tensor<float> q({5, 2, 4}), out({5, 2, 4});
  auto error_of = [&](std::vector<int64_t> cu_q, std::vector<int64_t> cu_k, AttentionOptions o = {}) -> std::string {
    try {
      varlen_attention_forward(out.view(), {}, q.cview(), q.cview(), q.cview(), cu_q, cu_k, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(error_of({1, 5}, {0, 5}), "varlen: cu_seqlens_q[0] must be 0, got 1");
  EXPECT_EQ(error_of({0, 3, 2, 5}, {0, 1, 2, 5}), "varlen: cu_seqlens_q must not decrease, but [2] = 2 < [1] = 3");
  EXPECT_EQ(error_of({0, 4}, {0, 5}), "varlen: cu_seqlens_q must end at the 5 packed rows, got 4");
  EXPECT_EQ(error_of({0, 5}, {0, 2, 5}),
            "varlen: cu_seqlens_q has 2 entries but cu_seqlens_k has 3: one per sequence plus one");
  EXPECT_EQ(error_of({}, {}), "varlen: cu_seqlens_q must have at least one entry (0)");
  AttentionOptions o;
  o.mask.key_lengths = {3};
  EXPECT_NE(error_of({0, 5}, {0, 5}, o).find("key_lengths, query_lengths, keep and bias masks are not supported"),
            std::string::npos);
  EXPECT_EQ(error_of({0, 2, 5}, {0, 5, 5}), "accepted");  // the second sequence has queries and no key
  // The options and heads are checked when no sequence has a key (then no kernel call checks them).
  AttentionOptions nan_scale;
  nan_scale.scale = std::numeric_limits<double>::quiet_NaN();
  const Tensor<float> none({0, 2, 4});
  const std::vector<int64_t> cu_q{0, 5}, cu_k{0, 0};
  test::expect_error(
      [&] { varlen_attention_forward(out.view(), {}, q.cview(), none.cview(), none.cview(), cu_q, cu_k, nan_scale); },
      {"scale must be finite"});
  const Tensor<float> three_heads({0, 3, 4});
  test::expect_error(
      [&] {
        varlen_attention_forward(out.view(), {}, q.cview(), three_heads.cview(), three_heads.cview(), cu_q, cu_k);
      },
      {"H = 2 query heads is not a positive multiple of Hkv = 3"});
}

// Outputs are checked whole before any sequence is written: sequence 0's rows of out over
// sequence 1's q took it, out over q with no key zeroed q, and the backward wrote dk into q before
// refusing a later sequence.
TEST(Varlen, RefusesOutputsOverAnySequencesInputs) {
  test::Rng rng("Varlen.Outputs");
  Tensor<float> qo = rng.normal32({8, 2, 4}), k = rng.normal32({5, 2, 4}), lse({2, 4});
  const Tensor<float> keep = to_contiguous<float>(qo.cview());
  const TensorView<const float> q(qo.data() + 4 * 8, {4, 2, 4});  // rows 4-7; out takes rows 0-3 and 4
  const TensorView<float> out(qo.data() + 8, {4, 2, 4});          // rows 1-4 of the buffer
  const std::vector<int64_t> cu_q{0, 1, 4}, cu_k{0, 2, 5};
  test::expect_error([&] { varlen_attention_forward(out, {}, q, k.cview(), k.cview(), cu_q, cu_k); },
                     {"varlen: out: shares memory with q"});
  const std::vector<int64_t> no_keys{0, 0, 0};
  const Tensor<float> none({0, 2, 4});
  test::expect_error(
      [&] {
        varlen_attention_forward(TensorView<float>(qo.data() + 32, {4, 2, 4}), {}, q, none.cview(), none.cview(), cu_q,
                                 no_keys);
      },
      {"varlen: out: shares memory with q"});
  for (int64_t e = 0; e < qo.numel(); ++e) ASSERT_EQ(qo[e], keep[e]) << "element " << e << " was written";
  Tensor<float> dq({4, 2, 4}), dv({5, 2, 4}), o({4, 2, 4}), dout = rng.normal32({4, 2, 4});
  Tensor<double> lse64({2, 4});
  test::expect_error(
      [&] {
        varlen_attention_backward(dq.view(), TensorView<float>(qo.data(), {5, 2, 4}), dv.view(), dout.cview(), q,
                                  k.cview(), k.cview(), o.cview(), lse64.cview(), cu_q, cu_k);
      },
      {"dk: shares memory with q"});
  for (int64_t e = 0; e < qo.numel(); ++e) ASSERT_EQ(qo[e], keep[e]) << "element " << e << " was written";
}

}  // namespace
}  // namespace qkv
