// Ring attention over MPI against the single-process fused kernel and the float64 reference.
// Run under mpirun with any number of ranks (ctest runs 2, 3 and 4 on loopback). Every rank
// builds the same random problem from one seed (printed by rank 0; replay with QKV_TEST_SEED),
// computes the ring forward and backward on its shard with 1, 2 and 3 threads, and checks:
// bitwise equality across the thread counts, out, lse, dq, dk, dv within 2e-5·(1 + max|ref|) of
// the fused kernel and of the float64 reference (with dropout, the same keep-mask: it is keyed by
// global positions), and zeros for fully masked rows. It checks which blocks of a step the ring
// joins into one call (ring::step_calls) and which it must not. Then every
// failure mode a user can hit must raise the same clear qkv::Error on every rank (no hang).
// Exit status: 0 if every check passed on every rank.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attention/backward_rows.h"
#include "distributed/ring_common.h"
#include "kernels/mask_eval.h"
#include "qkv/backward.h"
#include "qkv/reference.h"
#include "qkv/distributed.h"

namespace {

using qkv::Tensor;
using qkv::TensorView;

int g_rank = 0, g_ranks = 1, g_failures = 0;

void fail(const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "[rank %d] FAIL %s\n", g_rank, what.c_str());
}

struct Case {
  std::string name;
  int64_t B, H, Hkv, N, M, D, Dv;
  qkv::Sharding sharding;
  std::function<void(qkv::Mask&)> mask;
  double dropout = 0.0;  // p, with a seed from the test's
};

Tensor<float> random_tensor(std::mt19937_64& rng, std::initializer_list<int64_t> shape) {
  Tensor<float> t(shape);
  std::normal_distribution<float> dist;
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = dist(rng);
  return t;
}

Tensor<float> shard_of(const Tensor<float>& full, qkv::Sharding sharding) {
  const int64_t L = full.dim(2);
  const int64_t n = qkv::shard_length(L, g_ranks, g_rank, sharding);
  Tensor<float> shard({full.dim(0), full.dim(1), n, full.dim(3)});
  qkv::shard_sequence(shard.view(), full.cview(), g_ranks, g_rank, sharding);
  return shard;
}

// [B,H,N] seen as [B,H,N,1], the shape the sharding functions take.
TensorView<const float> as4(const Tensor<float>& t) {
  return TensorView<const float>(t.data(), {t.dim(0), t.dim(1), t.dim(2), 1});
}
Tensor<float> lse_shard_of(const Tensor<float>& full, qkv::Sharding sharding) {
  Tensor<float> shard({full.dim(0), full.dim(1), qkv::shard_length(full.dim(2), g_ranks, g_rank, sharding), 1});
  qkv::shard_sequence(shard.view(), as4(full), g_ranks, g_rank, sharding);
  return shard;
}

Tensor<float> to_float(const Tensor<double>& t) {
  Tensor<float> out(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<float>(t[i]);
  return out;
}

// max|got - ref| <= 2e-5·(1 + max|ref|) over this rank's shard; -inf must match -inf exactly.
void expect_close(const std::string& what, const float* got, const float* ref, int64_t n, double max_ref) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      if (got[i] != ref[i])
        return fail(fmt::format("{}: element {} is {} but the reference is {}", what, i, got[i], ref[i]));
      continue;
    }
    if (!std::isfinite(got[i])) return fail(fmt::format("{}: element {} is {}", what, i, got[i]));
    worst = std::max(worst, std::abs(double(got[i]) - double(ref[i])));
  }
  if (worst > 2e-5 * (1 + max_ref))
    fail(fmt::format("{}: max error {:.3g} above {:.3g}", what, worst, 2e-5 * (1 + max_ref)));
}

double max_abs(const Tensor<float>& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isfinite(t[i])) m = std::max(m, double(std::abs(t[i])));
  return m;
}

struct RingResult {
  Tensor<float> out, lse, dq, dk, dv;
};

// A tensor full of NaN: the ring must overwrite every output element, whatever it held.
Tensor<float> nan_tensor(std::span<const int64_t> shape) {
  Tensor<float> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = std::numeric_limits<float>::quiet_NaN();
  return t;
}

RingResult run_ring(const Case& c, const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                    const Tensor<float>& dout, const qkv::RingOptions& options) {
  RingResult r;
  r.out = nan_tensor(std::array<int64_t, 4>{c.B, c.H, q.dim(2), c.Dv});
  r.lse = nan_tensor(std::array<int64_t, 3>{c.B, c.H, q.dim(2)});
  qkv::ring_attention_forward(MPI_COMM_WORLD, r.out.view(), r.lse.view(), q.cview(), k.cview(), v.cview(), options);
  r.dq = nan_tensor(q.shape());
  r.dk = nan_tensor(k.shape());
  r.dv = nan_tensor(v.shape());
  qkv::ring_attention_backward(MPI_COMM_WORLD, r.dq.view(), r.dk.view(), r.dv.view(), dout.cview(), q.cview(),
                               k.cview(), v.cview(), r.out.cview(), r.lse.cview(), options);
  return r;
}

// t [B,H,L,C] stored as [B,L,H,C] (a PyTorch [B, N, H, D] tensor) and seen through strides:
// the ring may not assume contiguous inputs or gradients.
struct Strided {
  Tensor<float> storage;
  TensorView<float> view;
};
Strided strided_copy(const Tensor<float>& t) {
  const int64_t B = t.dim(0), H = t.dim(1), L = t.dim(2), C = t.dim(3);
  Strided s{Tensor<float>(std::array<int64_t, 4>{B, L, H, C}), {}};
  s.view = TensorView<float>(s.storage.data(), std::array<int64_t, 4>{B, H, L, C},
                             std::array<int64_t, 4>{L * H * C, C, H * C, 1});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t c = 0; c < C; ++c) s.view(b, h, l, c) = t.cview()(b, h, l, c);
  return s;
}

bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), sizeof(float) * a.numel()) == 0;
}

void run_case(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed ^ std::hash<std::string>{}(c.name));
  Tensor<float> q = random_tensor(rng, {c.B, c.H, c.N, c.D});
  Tensor<float> k = random_tensor(rng, {c.B, c.Hkv, c.M, c.D});
  Tensor<float> v = random_tensor(rng, {c.B, c.Hkv, c.M, c.Dv});
  Tensor<float> dout = random_tensor(rng, {c.B, c.H, c.N, c.Dv});
  qkv::AttentionOptions single;
  c.mask(single.mask);
  // The same keep-mask for the ring, the single call and the float64 reference: it is keyed by
  // global positions.
  single.dropout = {.p = c.dropout, .seed = seed, .offset = 3};
  single.kernel = qkv::Kernel::fused;
  single.num_threads = 1;

  // Single-process fused results and the float64 reference.
  Tensor<float> out({c.B, c.H, c.N, c.Dv}), lse({c.B, c.H, c.N});
  qkv::attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), single);
  Tensor<float> dq(q.shape()), dk(k.shape()), dv(v.shape());
  qkv::attention_backward(dq.view(), dk.view(), dv.view(), {}, dout.cview(), q.cview(), k.cview(), v.cview(),
                          out.cview(), lse.cview(), single);
  qkv::AttentionOptions ref_options = single;
  ref_options.kernel = qkv::Kernel::reference;
  Tensor<float> out64({c.B, c.H, c.N, c.Dv}), lse64({c.B, c.H, c.N});
  qkv::attention_forward(out64.view(), lse64.view(), q.cview(), k.cview(), v.cview(), ref_options);
  auto d = [](const Tensor<float>& t) { return qkv::to_contiguous<double>(t.cview()); };
  Tensor<double> q64 = d(q), k64 = d(k), v64 = d(v), dout64 = d(dout);
  Tensor<double> dq64(q.shape()), dk64(k.shape()), dv64(v.shape());
  qkv::reference_attention_backward(dq64.view(), dk64.view(), dv64.view(), {}, dout64.cview(), q64.cview(), k64.cview(),
                                    v64.cview(), ref_options);

  qkv::RingOptions options;
  options.attention = single;
  options.attention.kernel = qkv::Kernel::automatic;
  options.sharding = c.sharding;
  const Tensor<float> qs = shard_of(q, c.sharding), ks = shard_of(k, c.sharding), vs = shard_of(v, c.sharding);
  const Tensor<float> douts = shard_of(dout, c.sharding);
  options.attention.num_threads = 1;
  const RingResult one = run_ring(c, qs, ks, vs, douts, options);
  const std::string name = fmt::format("{} (P = {})", c.name, g_ranks);
  for (int threads : {2, 3}) {
    options.attention.num_threads = threads;
    const RingResult other = run_ring(c, qs, ks, vs, douts, options);
    if (!same_bits(one.out, other.out) || !same_bits(one.lse, other.lse) || !same_bits(one.dq, other.dq) ||
        !same_bits(one.dk, other.dk) || !same_bits(one.dv, other.dv))
      fail(fmt::format("{}: 1 and {} threads give different bits", name, threads));
  }

  // K, V, dK and dV as strided views give the same bits as contiguous tensors.
  options.attention.num_threads = 1;
  {
    const Strided ks_strided = strided_copy(ks), vs_strided = strided_copy(vs);
    Strided dk_strided = strided_copy(nan_tensor(ks.shape())), dv_strided = strided_copy(nan_tensor(vs.shape()));
    Tensor<float> dq = nan_tensor(qs.shape());
    qkv::ring_attention_backward(MPI_COMM_WORLD, dq.view(), dk_strided.view, dv_strided.view, douts.cview(), qs.cview(),
                                 ks_strided.view, vs_strided.view, one.out.cview(), one.lse.cview(), options);
    Tensor<float> out = nan_tensor(one.out.shape()), lse = nan_tensor(one.lse.shape());
    qkv::ring_attention_forward(MPI_COMM_WORLD, out.view(), lse.view(), qs.cview(), ks_strided.view, vs_strided.view,
                                options);
    if (!same_bits(out, one.out) || !same_bits(lse, one.lse) || !same_bits(dq, one.dq) ||
        !same_bits(qkv::to_contiguous<float>(dk_strided.view), one.dk) ||
        !same_bits(qkv::to_contiguous<float>(dv_strided.view), one.dv))
      fail(name + ": strided K/V or dK/dV give different bits than contiguous ones");
  }

  struct Check {
    const char* what;
    const Tensor<float>& got;
    Tensor<float> fused, ref;
  };
  Tensor<float> dq_ref = to_float(dq64), dk_ref = to_float(dk64), dv_ref = to_float(dv64);
  Check checks[] = {
      {"out", one.out, shard_of(out, c.sharding), shard_of(out64, c.sharding)},
      {"lse", one.lse, lse_shard_of(lse, c.sharding), lse_shard_of(lse64, c.sharding)},
      {"dq", one.dq, shard_of(dq, c.sharding), shard_of(dq_ref, c.sharding)},
      {"dk", one.dk, shard_of(dk, c.sharding), shard_of(dk_ref, c.sharding)},
      {"dv", one.dv, shard_of(dv, c.sharding), shard_of(dv_ref, c.sharding)},
  };
  const Tensor<float>* full[] = {&out, &lse, &dq, &dk, &dv};
  for (int i = 0; i < 5; ++i) {
    const Check& ch = checks[i];
    const double bound = max_abs(*full[i]);
    expect_close(fmt::format("{} {} vs fused", name, ch.what), ch.got.data(), ch.fused.data(), ch.got.numel(), bound);
    expect_close(fmt::format("{} {} vs float64", name, ch.what), ch.got.data(), ch.ref.data(), ch.got.numel(), bound);
  }
  // Fully masked rows (lse = -inf) must be exact zeros.
  for (int64_t row = 0; row < one.lse.numel(); ++row)
    if (one.lse[row] == -std::numeric_limits<float>::infinity())
      for (int64_t j = 0; j < c.Dv; ++j)
        if (one.out[row * c.Dv + j] != 0.0f) fail(name + ": a fully masked row is not zero");
}

std::vector<Case> cases() {
  using qkv::CausalAlign;
  using qkv::Sharding;
  auto none = [](qkv::Mask&) {};
  auto causal = [](qkv::Mask& m) { m.causal = CausalAlign::top_left; };
  return {
      {"plain contiguous", 1, 2, 2, 37, 37, 40, 40, Sharding::contiguous, none},
      {"plain zigzag", 2, 2, 2, 33, 33, 16, 24, Sharding::zigzag, none},
      {"causal zigzag", 1, 2, 2, 50, 50, 59, 59, Sharding::zigzag, causal},
      {"causal contiguous", 1, 1, 1, 31, 31, 32, 32, Sharding::contiguous, causal},
      {"causal bottom-right cross", 1, 2, 1, 13, 29, 40, 33, Sharding::zigzag,
       [](qkv::Mask& m) { m.causal = CausalAlign::bottom_right; }},
      {"cross attention", 1, 2, 2, 19, 45, 24, 16, Sharding::zigzag, none},
      {"window", 1, 2, 2, 41, 41, 32, 32, Sharding::zigzag,
       [](qkv::Mask& m) {
         m.window = qkv::Window{5, 3};
       }},
      {"causal window", 1, 1, 1, 64, 64, 111, 111, Sharding::zigzag,
       [](qkv::Mask& m) {
         m.causal = CausalAlign::top_left;
         m.window = qkv::Window{7, -1};
       }},
      {"key and query lengths, empty row", 2, 2, 2, 27, 27, 24, 24, Sharding::zigzag,
       [](qkv::Mask& m) {
         m.causal = CausalAlign::bottom_right;
         m.key_lengths = {20, 0};
         m.query_lengths = {25, 9};
       }},
      {"GQA causal", 1, 4, 2, 45, 45, 32, 32, Sharding::zigzag, causal},
      {"ALiBi softcap causal", 1, 2, 2, 29, 29, 16, 16, Sharding::zigzag,
       [](qkv::Mask& m) {
         m.causal = CausalAlign::top_left;
         m.alibi_slopes = {0.5f, 0.125f};
         m.softcap = 5.0f;
       }},
      {"N = 3, M = 5 (empty shards)", 1, 2, 2, 3, 5, 24, 24, Sharding::zigzag, causal},
      // Blocks that step_calls joins into one call (see run_step_call_tests) and some it must not.
      {"softcap plain zigzag (joined)", 1, 2, 2, 44, 44, 16, 16, Sharding::zigzag,
       [](qkv::Mask& m) { m.softcap = 4.0f; }},
      {"window wider than the sequence (joined)", 2, 2, 1, 35, 35, 16, 16, Sharding::zigzag,
       [](qkv::Mask& m) {
         m.causal = CausalAlign::top_left;
         m.window = qkv::Window{40, 0};
       }},
      {"ALiBi plain zigzag (not joined)", 1, 2, 2, 42, 42, 16, 16, Sharding::zigzag,
       [](qkv::Mask& m) {
         m.alibi_slopes = {0.25f, 0.0625f};
       }},
      {"key length inside a chunk (not joined)", 1, 2, 2, 40, 40, 16, 16, Sharding::zigzag,
       [](qkv::Mask& m) { m.key_lengths = {37}; }},
      {"N = 1", 1, 1, 1, 1, 1, 40, 40, Sharding::contiguous, none},
      {"dropout causal zigzag", 2, 2, 1, 37, 37, 16, 24, Sharding::zigzag, causal, 0.3},
      {"dropout plain contiguous", 1, 2, 2, 29, 29, 40, 40, Sharding::contiguous, none, 0.2},
      {"dropout window, lengths", 2, 2, 2, 27, 27, 16, 16, Sharding::zigzag,
       [](qkv::Mask& m) {
         m.window = qkv::Window{4, 2};
         m.key_lengths = {20, 25};
       },
       0.5},
  };
}

// A call that must throw qkv::Error on every rank with a message containing `expect`.
void expect_error(const std::string& name, const std::string& expect, const std::function<void()>& call) {
  try {
    call();
    fail(name + ": no error");
  } catch (const qkv::Error& e) {
    if (std::string(e.what()).find(expect) == std::string::npos)
      fail(fmt::format("{}: message \"{}\" lacks \"{}\"", name, e.what(), expect));
  }
}

void run_error_cases() {
  const qkv::Sharding zig = qkv::Sharding::zigzag;
  const int64_t N = 20, n = qkv::shard_length(N, g_ranks, g_rank, zig);
  auto call = [&](int64_t D_here, int64_t n_here, int64_t out_dv, bool causal_here) {
    Tensor<float> q({1, 2, n_here, D_here}), k({1, 2, n_here, D_here}), v({1, 2, n_here, 8});
    Tensor<float> out({1, 2, n_here, out_dv}), lse({1, 2, n_here});
    qkv::RingOptions o;
    if (causal_here) o.attention.mask.causal = qkv::CausalAlign::top_left;
    qkv::ring_attention_forward(MPI_COMM_WORLD, out.view(), lse.view(), q.cview(), k.cview(), v.cview(), o);
  };
  const int last = g_ranks - 1;
  expect_error("mismatched D", fmt::format("rank {} has [B, H, Hkv, D, Dv] = [1, 2, 2, 9, 8]", last),
               [&] { call(g_rank == last ? 9 : 16, n, 8, false); });
  expect_error("bad out shape on one rank", fmt::format("rank {}: ring attention: out", last),
               [&] { call(16, n, g_rank == last ? 7 : 8, false); });
  expect_error("options differ", fmt::format("rank {} was called with another mask (causal", last),
               [&] { call(16, n, 8, g_rank == last && last > 0); });
  // Every rank's count is listed: the sums make the layout wrong for ranks that hold the right count.
  expect_error("shard sizes off the layout",
               fmt::format("ranks 0 to {} hold [{}", last, qkv::shard_length(N, g_ranks, 0, zig) + 2),
               [&] { call(16, g_rank == 0 ? n + 2 : n, 8, false); });
  expect_error("dropout seeds differ", fmt::format("rank {} was called with another dropout (p, seed, offset)", last),
               [&] {
                 Tensor<float> t({1, 1, n, 8});
                 qkv::RingOptions o;
                 o.attention.dropout = {.p = 0.1, .seed = g_rank == last && last > 0 ? 2u : 1u};
                 qkv::ring_attention_forward(MPI_COMM_WORLD, t.view(), {}, t.cview(), t.cview(), t.cview(), o);
               });
  // A fault in one rank's steps, after the agreement (finite inputs whose scores pass float32 in
  // its rows only; an lse that makes its gradients overflow): every rank raises it at the end of
  // the call instead of waiting for that rank forever.
  auto filled = [&](float x) {
    Tensor<float> t({1, 1, n, 8});
    std::fill(t.data(), t.data() + t.numel(), x);
    return t;
  };
  const Tensor<float> ones = filled(1.0f), big_k = filled(1e19f);
  expect_error(
      "overflow in one rank's steps",
      fmt::format("rank {}: ring attention: the output overflowed float32 although q, k and v are finite", last), [&] {
        Tensor<float> out = filled(0.0f);
        const Tensor<float> q = filled(g_rank == last ? 1e20f : 1.0f);
        qkv::ring_attention_forward(MPI_COMM_WORLD, out.view(), {}, q.cview(), big_k.cview(), ones.cview(), {});
      });
  expect_error("overflow in one rank's backward", fmt::format("rank {}: ", last), [&] {
    Tensor<float> out = filled(0.0f), lse({1, 1, n}), dq = filled(0.0f), dk = filled(0.0f), dv = filled(0.0f);
    qkv::ring_attention_forward(MPI_COMM_WORLD, out.view(), lse.view(), ones.cview(), ones.cview(), ones.cview(), {});
    if (g_rank == last)
      for (int64_t i = 0; i < lse.numel(); ++i) lse[i] -= 1000.0f;
    qkv::ring_attention_backward(MPI_COMM_WORLD, dq.view(), dk.view(), dv.view(), ones.cview(), ones.cview(),
                                 ones.cview(), ones.cview(), out.cview(), lse.cview(), {});
  });
  // A NaN lse in the last row of one rank's shard: named as that rank's lse row, whichever of the
  // ring's block calls reads it (with dropout a zigzag shard's two chunks are separate calls).
  expect_error(
      "a NaN lse on one rank",
      fmt::format("rank {}: ring attention backward: lse[0, 0, {}] (batch, head, query row) is NaN although "
                  "q, k and v are finite; no forward gives that",
                  last, qkv::shard_length(N, g_ranks, last, zig) - 1),
      [&] {
        Tensor<float> out = filled(0.0f), lse({1, 1, n}), dq = filled(0.0f), dk = filled(0.0f), dv = filled(0.0f);
        qkv::RingOptions o;
        o.attention.dropout = {.p = 0.25, .seed = 7};
        qkv::ring_attention_forward(MPI_COMM_WORLD, out.view(), lse.view(), ones.cview(), ones.cview(), ones.cview(),
                                    o);
        if (g_rank == last) lse[n - 1] = std::numeric_limits<float>::quiet_NaN();
        qkv::ring_attention_backward(MPI_COMM_WORLD, dq.view(), dk.view(), dv.view(), ones.cview(), ones.cview(),
                                     ones.cview(), ones.cview(), out.cview(), lse.cview(), o);
      });
  expect_error("bias refused", "keep and bias masks are not supported", [&] {
    Tensor<float> t({1, 1, n, 8}), bias({1, 1, 1, 1});
    qkv::RingOptions o;
    const std::array<int64_t, 4> shape{1, 1, n, N}, strides{0, 0, 0, 0};
    o.attention.mask.bias = TensorView<const float>(bias.data(), shape, strides);
    qkv::ring_attention_forward(MPI_COMM_WORLD, t.view(), {}, t.cview(), t.cview(), t.cview(), o);
  });
  expect_error("global key length", "key_lengths[0] = 21 is outside [0, 20]", [&] {
    Tensor<float> t({1, 1, n, 8});
    qkv::RingOptions o;
    o.attention.mask.key_lengths = {21};
    qkv::ring_attention_forward(MPI_COMM_WORLD, t.view(), {}, t.cview(), t.cview(), t.cview(), o);
  });
  if (g_failures == 0 && g_rank == 0) std::printf("error cases: every rank raised the expected error\n");
}

// shard_sequence then unshard_sequence on every rank rebuilds the sequence exactly.
void run_shard_roundtrip(uint64_t seed) {
  for (qkv::Sharding sharding : {qkv::Sharding::contiguous, qkv::Sharding::zigzag})
    for (int64_t L : {0, 1, 3, 7, 50}) {
      std::mt19937_64 rng(seed + L);
      Tensor<float> full = random_tensor(rng, {2, 3, L, 5});
      Tensor<float> rebuilt({2, 3, L, 5});
      int64_t total = 0;
      for (int r = 0; r < g_ranks; ++r) {
        Tensor<float> shard({2, 3, qkv::shard_length(L, g_ranks, r, sharding), 5});
        qkv::shard_sequence(shard.view(), full.cview(), g_ranks, r, sharding);
        qkv::unshard_sequence(rebuilt.view(), shard.cview(), g_ranks, r, sharding);
        total += shard.dim(2);
      }
      if (total != L || !same_bits(full, rebuilt)) fail(fmt::format("shard round trip L = {}", L));
    }
}

// The two kernel options the ring relies on, on one process. diagonal_offsets: the query rows
// [8, 20) of a causal, windowed, ALiBi call over all 20 keys, computed alone with offset 8, equal
// those rows of the whole call bitwise. partial_rows: a row whose block holds one allowed key
// still gets its gradient (the shortcut that zeroes it would be wrong in a block).
void run_mask_field_tests(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor<float> q = random_tensor(rng, {1, 2, 20, 16}), k = random_tensor(rng, {1, 2, 20, 16});
  Tensor<float> v = random_tensor(rng, {1, 2, 20, 16});
  qkv::AttentionOptions o;
  o.kernel = qkv::Kernel::fused;
  o.mask.causal = qkv::CausalAlign::top_left;
  o.mask.window = qkv::Window{5, -1};
  o.mask.alibi_slopes = {0.5f, 0.25f};
  Tensor<float> out({1, 2, 20, 16}), lse({1, 2, 20});
  qkv::attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), o);
  const std::array<int64_t, 4> shape{1, 2, 12, 16};
  const std::array<int64_t, 4> strides{2 * 20 * 16, 20 * 16, 16, 1};
  TensorView<const float> rows(q.data() + 8 * 16, shape, strides);
  Tensor<float> part({1, 2, 12, 16});
  o.mask.diagonal_offsets = {8};
  qkv::attention_forward(part.view(), {}, rows, k.cview(), v.cview(), o);
  for (int64_t h = 0; h < 2; ++h)
    if (std::memcmp(part.data() + h * 12 * 16, out.data() + (h * 20 + 8) * 16, 12 * 16 * sizeof(float)) != 0)
      fail("diagonal_offsets: rows computed alone differ from the same rows of the whole call");
  o.mask.diagonal_offsets = {1, 2};
  expect_error("diagonal_offsets size", "diagonal_offsets: expected 1 entries",
               [&] { qkv::attention_forward(part.view(), {}, rows, k.cview(), v.cview(), o); });
  // Row 0 of a causal call sees only key 0; as a block of a longer row (lse larger than its own
  // logit) its dq is not zero, and with the shortcut on it is.
  qkv::AttentionOptions c;
  c.kernel = qkv::Kernel::fused;
  c.mask.causal = qkv::CausalAlign::top_left;
  Tensor<float> q1 = random_tensor(rng, {1, 1, 1, 8}), k1 = random_tensor(rng, {1, 1, 1, 8});
  Tensor<float> v1 = random_tensor(rng, {1, 1, 1, 8}), o1 = random_tensor(rng, {1, 1, 1, 8});
  Tensor<float> dout1 = random_tensor(rng, {1, 1, 1, 8}), lse1({1, 1, 1}), dq1({1, 1, 1, 8});
  Tensor<float> dk1({1, 1, 1, 8}), dv1({1, 1, 1, 8});
  lse1[0] = 3.0f;
  bool partial = false;
  auto dq_norm = [&] {
    qkv::detail::attention_backward_rows(dq1.view(), dk1.view(), dv1.view(), {}, dout1.cview(), q1.cview(), k1.cview(),
                                         v1.cview(), o1.cview(), lse1.cview(), c, {.partial = partial});
    double n = 0;
    for (int64_t i = 0; i < 8; ++i) n += std::abs(dq1[i]);
    return n;
  };
  if (dq_norm() != 0) fail("partial_rows off: a single-key row should get the zero-gradient shortcut");
  partial = true;
  if (dq_norm() == 0) fail("partial_rows: a single-key block row got a zero gradient");
}

// Which blocks step_calls joins, on N = 40 zigzag (chunks of 10 to 5 tokens for P = 2 to 4).
// Every call's mask must give each of its (query, key) pairs the global mask's verdict, and every
// pair the global mask allows must be in exactly one call; the number of calls per step shows
// the joining (one call where a single mask in the calls' positions reproduces the blocks, per
// block where key lengths cut a chunk or ALiBi is on). run_case checks the values.
void run_step_call_tests() {
  namespace ring = qkv::ring;
  const int64_t N = 40, n = qkv::shard_length(N, g_ranks, g_rank, qkv::Sharding::zigzag);
  constexpr std::size_t kAny = std::size_t(-1);
  Tensor<float> t({1, 2, n, 8});
  // Global position of row x of a shard.
  auto global = [](const std::vector<ring::Chunk>& chunks, int64_t x) {
    for (const ring::Chunk& c : chunks)
      if (x >= c.offset && x < c.offset + c.global.size()) return c.global.begin + (x - c.offset);
    return int64_t{-1};
  };
  auto shape = [](int64_t rows, int64_t keys) { return qkv::AttentionShape{1, 2, 2, rows, keys, 8, 8}; };
  auto check = [&](const std::string& name, const std::function<void(qkv::Mask&)>& mask, std::size_t want0,
                   std::size_t want_src0, std::size_t want) {
    qkv::RingOptions o;
    mask(o.attention.mask);
    const ring::Plan plan = ring::make_plan(MPI_COMM_WORLD, t.cview(), t.cview(), t.cview(), o, [](const auto&) {});
    const qkv::detail::MaskEval whole(o.attention.mask, shape(N, N));
    for (int s = 0; s < g_ranks; ++s) {
      const int src = (g_rank - s + g_ranks) % g_ranks;
      const std::vector<ring::BlockCall> got = ring::step_calls(plan, o, src);
      const std::size_t expect = s == 0 ? want0 : src == 0 ? want_src0 : want;
      if (expect != kAny && got.size() != expect)
        fail(fmt::format("step_calls {}: step {} makes {} calls, want {}", name, s, got.size(), expect));
      const int64_t m = plan.kv_tokens(src);
      std::vector<int> covered(static_cast<std::size_t>(n * m));
      for (const ring::BlockCall& c : got) {
        const qkv::detail::MaskEval call(c.options.mask, shape(c.n, c.m));
        for (int64_t u = 0; u < c.n; ++u)
          for (int64_t w = 0; w < c.m; ++w) {
            const qkv::detail::KeyBand mine = call.band(0, u);
            const qkv::detail::KeyBand all = whole.band(0, global(plan.q_chunks[g_rank], c.q_offset + u));
            const int64_t j = global(plan.kv_chunks[src], c.k_offset + w);
            const bool allowed = mine.lo <= w && w < mine.hi;
            if (allowed != (all.lo <= j && j < all.hi))
              return fail(fmt::format("step_calls {}: step {} masks a pair unlike the global mask", name, s));
            covered[(c.q_offset + u) * m + c.k_offset + w] += allowed;
          }
      }
      for (int64_t x = 0; x < n; ++x)
        for (int64_t y = 0; y < m; ++y) {
          const qkv::detail::KeyBand all = whole.band(0, global(plan.q_chunks[g_rank], x));
          const int64_t j = global(plan.kv_chunks[src], y);
          if (covered[x * m + y] != int(all.lo <= j && j < all.hi))
            return fail(fmt::format("step_calls {}: step {} covers a pair {} times", name, s, covered[x * m + y]));
        }
    }
  };
  auto causal = [](qkv::Mask& m) { m.causal = qkv::CausalAlign::top_left; };
  check(
      "plain", [](qkv::Mask&) {}, 1, 1, 1);
  check(
      "softcap", [](qkv::Mask& m) { m.softcap = 3.0f; }, 1, 1, 1);
  check(
      "window wider than the sequence",
      [](qkv::Mask& m) {
        m.window = qkv::Window{45, 45};
      },
      1, 1, 1);
  // Even the diagonal step: the shard's chunks are in global order, so it is causal in shard rows.
  check("causal", causal, 1, 1, 1);
  check(
      "ALiBi",
      [](qkv::Mask& m) {
        m.alibi_slopes = {0.5f, 0.25f};
      },
      4, 4, 4);
  // Rank 0 holds the last chunk, [30, 40) to [35, 40): key 37 cuts it.
  check(
      "key length 37", [](qkv::Mask& m) { m.key_lengths = {37}; }, g_rank == 0 ? 4 : 1, 4, 1);
  check(
      "causal key length 37",
      [](qkv::Mask& m) {
        m.causal = qkv::CausalAlign::top_left;
        m.key_lengths = {37};
      },
      kAny, kAny, kAny);
  check(
      "window 2",
      [](qkv::Mask& m) {
        m.window = qkv::Window{2, 2};
      },
      kAny, kAny, kAny);
  check(
      "causal window 7",
      [](qkv::Mask& m) {
        m.causal = qkv::CausalAlign::top_left;
        m.window = qkv::Window{7, -1};
      },
      kAny, kAny, kAny);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_ranks);
  uint64_t seed = 0;
  if (const char* env = std::getenv("QKV_TEST_SEED"))
    seed = std::strtoull(env, nullptr, 10);
  else
    seed = std::random_device{}();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf("ring_test: %d ranks, QKV_TEST_SEED=%llu\n", g_ranks, static_cast<unsigned long long>(seed));
  run_shard_roundtrip(seed);
  run_mask_field_tests(seed);
  run_step_call_tests();
  for (const Case& c : cases()) {
    try {
      run_case(c, seed);
    } catch (const std::exception& e) {
      fail(c.name + ": threw " + e.what());
    }
    if (g_rank == 0) std::printf("case %-36s done\n", c.name.c_str());
  }
  run_error_cases();
  int failures = 0;
  MPI_Allreduce(&g_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) std::printf("ring_test: %s (%d failed checks)\n", failures == 0 ? "PASSED" : "FAILED", failures);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
