// The compute of one ring step, forward and backward (ring_plan.h), for any transport.
#include <algorithm>
#include <cmath>
#include <limits>

#include "distributed/ring_plan.h"
#include "attention/backward_rows.h"
#include "attention/forward_as.h"

namespace qkv::ring {
namespace {

// Messages of a block's forward and backward name ring attention and its remedy.
constexpr detail::Caller kForwardCaller{"ring attention", detail::kRingOverflowRemedy};
constexpr detail::Caller kBackwardCaller{"ring attention backward", detail::kRingOverflowRemedy};

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

ForwardSteps::ForwardSteps(const Plan& plan, const RingOptions& options, TensorView<float> out,
                           TensorView<const float> q)
    : plan_(plan),
      options_(options),
      out_(out),
      q_(q),
      threads_(resolve_num_threads(options.attention.num_threads)),
      lse_(static_cast<std::size_t>(plan.B * plan.H * plan.q_tokens(plan.rank)),
           -std::numeric_limits<float>::infinity()),
      // A call may span the whole shard (coalesced blocks, see step_calls).
      block_out_(plan.B * plan.H * plan.q_tokens(plan.rank) * plan.Dv, "ring attention block out"),
      block_lse_(plan.B * plan.H * plan.q_tokens(plan.rank), "ring attention block lse"),
      // Rows of out per query chunk; the lse starts at -inf, so emptying out is enough.
      acc_(plan.q_chunks[plan.rank].size(), [this](int c) {
        const Chunk& chunk = plan_.q_chunks[plan_.rank][c];
        fill_zero(rows(out_, chunk.offset, chunk.global.size()), threads_);
      }) {}

void ForwardSteps::step(int src, ShardAt shard) {
  const int64_t Nr = plan_.q_tokens(plan_.rank);
  const TensorView<float> acc_lse(lse_.data(), {plan_.B, plan_.H, Nr});
  for (const BlockCall& c : step_calls(plan_, options_, src)) {
    const TensorView<float> acc_out = rows(out_, c.q_offset, c.n);
    const TensorView<float> acc_l = rows(acc_lse, c.q_offset, c.n);
    const TensorView<const float> kc = shard.k_rows(plan_, src, c.k_offset, c.m);
    const TensorView<const float> vc = shard.v_rows(plan_, src, c.k_offset, c.m);
    if (acc_.claim(c.q_first, c.q_end)) {
      detail::attention_forward_as(kForwardCaller, acc_out, acc_l, rows(q_, c.q_offset, c.n), kc, vc, c.options);
      continue;
    }
    TensorView<float> bo(block_out_.data(), {plan_.B, plan_.H, c.n, plan_.Dv});
    TensorView<float> bl(block_lse_.data(), {plan_.B, plan_.H, c.n});
    detail::attention_forward_as(kForwardCaller, bo, bl, rows(q_, c.q_offset, c.n), kc, vc, c.options);
    merge_block(acc_out, acc_l, bo, bl, threads_);
  }
}

void ForwardSteps::finish(TensorView<float> lse) {
  acc_.finish();
  if (lse.empty()) return;
  const int64_t Nr = plan_.q_tokens(plan_.rank);
  const std::array<int64_t, 4> shape4{plan_.B, plan_.H, Nr, 1};
  const std::array<int64_t, 4> lse_strides{lse.stride(0), lse.stride(1), lse.stride(2), 1};
  copy_into(TensorView<float>(lse.data(), shape4, lse_strides), TensorView<const float>(lse_.data(), shape4), threads_);
}

BackwardSteps::BackwardSteps(const Plan& plan, const RingOptions& options, TensorView<float> dq,
                             TensorView<const float> dout, TensorView<const float> q, TensorView<const float> out,
                             TensorView<const float> lse)
    : plan_(plan),
      options_(options),
      dq_(dq),
      dout_(dout),
      q_(q),
      out_(out),
      lse_(lse),
      threads_(resolve_num_threads(options.attention.num_threads)),
      // A call may span a whole shard (coalesced blocks, see step_calls).
      dq_block_(plan.B * plan.H * plan.q_tokens(plan.rank) * plan.D, "ring attention block dq"),
      dk_block_(plan.B * plan.Hkv * plan.max_kv_tokens * plan.D, "ring attention block dk"),
      dv_block_(plan.B * plan.Hkv * plan.max_kv_tokens * plan.Dv, "ring attention block dv"),
      dq_acc_(plan.q_chunks[plan.rank].size(), [this](int c) {
        const Chunk& chunk = plan_.q_chunks[plan_.rank][c];
        fill_zero(rows(dq_, chunk.offset, chunk.global.size()), threads_);
      }) {}

void BackwardSteps::step(int src, ShardAt shard, float* dk, float* dv) {
  auto local_k = [&](int64_t offset, int64_t m) { return shard_rows(plan_, dk, src, offset, m, plan_.D); };
  auto local_v = [&](int64_t offset, int64_t m) { return shard_rows(plan_, dv, src, offset, m, plan_.Dv); };
  Accumulators local_acc(plan_.kv_chunks[src].size(), [&](int c) {
    const Chunk& chunk = plan_.kv_chunks[src][c];
    fill_zero(local_k(chunk.offset, chunk.global.size()), threads_);
    fill_zero(local_v(chunk.offset, chunk.global.size()), threads_);
  });
  for (const BlockCall& c : step_calls(plan_, options_, src)) {
    const int64_t n = c.n, m = c.m;
    const bool dq_fresh = dq_acc_.claim(c.q_first, c.q_end), dkv_fresh = local_acc.claim(c.k_first, c.k_end);
    const TensorView<float> dq_rows = rows(dq_, c.q_offset, n);
    const TensorView<float> dk_rows = local_k(c.k_offset, m), dv_rows = local_v(c.k_offset, m);
    // A first contribution goes in place, a later one to the block buffer and is added.
    auto target = [](bool fresh, TensorView<float> place, const Scratch& block) {
      return fresh ? place : TensorView<float>(block.data(), place.shape());
    };
    const TensorView<float> bdq = target(dq_fresh, dq_rows, dq_block_);
    const TensorView<float> bdk = target(dkv_fresh, dk_rows, dk_block_), bdv = target(dkv_fresh, dv_rows, dv_block_);
    detail::attention_backward_rows(
        bdq, bdk, bdv, TensorView<float>(), rows(dout_, c.q_offset, n), rows(q_, c.q_offset, n),
        shard.k_rows(plan_, src, c.k_offset, m), shard.v_rows(plan_, src, c.k_offset, m), rows(out_, c.q_offset, n),
        rows(lse_, c.q_offset, n), c.options, {.partial = true, .caller = kBackwardCaller, .row0 = c.q_offset});
    if (!dq_fresh) add_into(dq_rows, bdq, threads_);
    if (!dkv_fresh) {
      add_into(dk_rows, bdk, threads_);
      add_into(dv_rows, bdv, threads_);
    }
  }
  local_acc.finish();
}

void BackwardSteps::finish() { dq_acc_.finish(); }

}  // namespace qkv::ring
