// Ring attention forward. Rank r holds its query shard; at step s it holds the K/V shard of rank
// (r - s) mod P, receives the next one from r - 1 and sends the current one to r + 1 while it
// computes the fused attention of its query chunks against the current K/V chunks (the calls of
// ring::step_calls). The partial (out, lse) of each call merges into the running result by
// log-sum-exp in fp32, in ring order, which is fixed for a given P: the result does not depend on
// threads or message timing. A row's first partial is written in place (merging it would copy it).

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "distributed/ring_common.h"

namespace qkv {
namespace {

constexpr int kTagKV = 0x4b56;

// Merges a block's (out, lse) into the running (acc_out, acc_lse), all [B,H,n,·].
void merge_block(TensorView<float> acc_out, TensorView<float> acc_lse, TensorView<const float> out,
                 TensorView<const float> lse, int threads) {
  const int64_t B = acc_out.dim(0), H = acc_out.dim(1), n = acc_out.dim(2), Dv = acc_out.dim(3);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t i = 0; i < n; ++i) {
      const float lb = lse(b, h, i);
      if (lb == -std::numeric_limits<float>::infinity()) continue;
      float& la = acc_lse(b, h, i);
      const float m = std::max(la, lb);
      const float wa = std::exp(la - m), wb = std::exp(lb - m);
      const float sum = wa + wb;
      const float ca = wa / sum, cb = wb / sum;
      for (int64_t c = 0; c < Dv; ++c) acc_out(b, h, i, c) = acc_out(b, h, i, c) * ca + out(b, h, i, c) * cb;
      la = m + std::log(sum);
    }
  }
}

}  // namespace

void ring_attention_forward(MPI_Comm user_comm, TensorView<float> out, TensorView<float> lse, TensorView<const float> q,
                            TensorView<const float> k, TensorView<const float> v, const RingOptions& options) {
  const ring::Plan plan = ring::make_plan(user_comm, q, k, v, options, [&](const AttentionShape& s) {
    const std::array<int64_t, 4> want_out{s.B, s.H, s.N, s.Dv};
    if (!std::ranges::equal(out.shape(), want_out))
      throw Error(fmt::format("ring attention: out {} must be {}", shape_string(out.shape()), shape_string(want_out)));
    const std::array<int64_t, 3> want_lse{s.B, s.H, s.N};
    if (!lse.empty() && !std::ranges::equal(lse.shape(), want_lse))
      throw Error(fmt::format("ring attention: lse {} must be {}", shape_string(lse.shape()), shape_string(want_lse)));
  });
  ring::CommDup comm(user_comm);
  const int P = plan.ranks, r = plan.rank;
  const int threads = resolve_num_threads(options.attention.num_threads);
  const int64_t Nr = plan.q_tokens(r);

  Tensor<float> acc_lse({plan.B, plan.H, Nr}, "ring attention lse");
  for (int64_t i = 0; i < acc_lse.numel(); ++i) acc_lse[i] = -std::numeric_limits<float>::infinity();
  // A call may span the whole shard (coalesced blocks, see step_calls).
  const ring::Scratch block_out(plan.B * plan.H * Nr * plan.Dv, "ring attention block out");
  const ring::Scratch block_lse(plan.B * plan.H * Nr, "ring attention block lse");
  const ring::Scratch buffers[2] = {{plan.max_kv_floats(), "ring attention K/V buffer"},
                                    {plan.max_kv_floats(), "ring attention K/V buffer"}};
  const ring::ShardAt own = ring::own_shard(plan, k, v, buffers[0].data(), threads);

  // Rows of out and acc_lse per query chunk; acc_lse starts at -inf, so emptying out is enough.
  ring::Accumulators acc(plan.q_chunks[r].size(), [&](int c) {
    const ring::Chunk& chunk = plan.q_chunks[r][c];
    ring::fill_zero(ring::rows(out, chunk.offset, chunk.global.size()), threads);
  });
  ring::Transfers transfers;
  for (int s = 0; s < P; ++s) {
    const int src = (r - s + P) % P;
    // The shard at hand: this rank's own at step 0, else the one received into buffers[s % 2].
    const ring::ShardAt current = s == 0 ? own : ring::packed_shard(plan, buffers[s % 2].data(), src);
    if (s + 1 < P) {
      const int next_src = (r - s - 1 + P) % P;
      float* next = buffers[(s + 1) % 2].data();
      transfers.recv_shard(plan, next_src, next, next + plan.k_floats(next_src), (r - 1 + P) % P, kTagKV, comm.get());
      transfers.send_shard(plan, src, current, (r + 1) % P, kTagKV, comm.get());
      transfers.poll(ring::kPollSeconds);
    }
    for (const ring::BlockCall& c : ring::step_calls(plan, options, src)) {
      const TensorView<float> acc_out = ring::rows(out, c.q_offset, c.n);
      const TensorView<float> acc_l = ring::rows(acc_lse.view(), c.q_offset, c.n);
      const TensorView<const float> kc = current.k_rows(plan, src, c.k_offset, c.m);
      const TensorView<const float> vc = current.v_rows(plan, src, c.k_offset, c.m);
      if (acc.claim(c.q_first, c.q_end)) {
        attention_forward(acc_out, acc_l, ring::rows(q, c.q_offset, c.n), kc, vc, c.options);
        continue;
      }
      TensorView<float> bo(block_out.data(), {plan.B, plan.H, c.n, plan.Dv});
      TensorView<float> bl(block_lse.data(), {plan.B, plan.H, c.n});
      attention_forward(bo, bl, ring::rows(q, c.q_offset, c.n), kc, vc, c.options);
      merge_block(acc_out, acc_l, bo, bl, threads);
    }
    transfers.wait();
  }
  acc.finish();
  if (!lse.empty()) {
    const std::array<int64_t, 4> shape4{plan.B, plan.H, Nr, 1};
    const std::array<int64_t, 4> lse_strides{lse.stride(0), lse.stride(1), lse.stride(2), 1};
    ring::copy_into(TensorView<float>(lse.data(), shape4, lse_strides), TensorView<const float>(acc_lse.data(), shape4),
                    threads);
  }
}

}  // namespace qkv
