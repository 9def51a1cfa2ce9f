// Ring attention backward (as ring-flash-attention does it): the K/V shards travel the ring as in
// the forward, and with each shard travels the running sum of its dK/dV. At step s rank r holds
// the K/V of rank src = (r - s) mod P, computes the fused backward of its query chunks against it
// (P recomputed from the forward's lse), adds dq into its own dq, then adds its dK/dV to the sum
// received from r - 1 and sends it on to r + 1; after P steps each sum reaches its owner. Every
// sum is taken in ring order, fixed for a given P, so results do not depend on threads or timing.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "attention/backward_checks.h"
#include "distributed/ring_common.h"
#include "qkv/backward.h"

namespace qkv {
namespace {

constexpr int kTagKV = 0x4b56;
constexpr int kTagGrad = 0x6447;

void add_flat(float* dst, const float* src, int64_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

int64_t max_chunk(const std::vector<std::vector<ring::Chunk>>& all) {
  int64_t n = 0;
  for (const auto& chunks : all)
    for (const ring::Chunk& c : chunks) n = std::max(n, c.global.size());
  return n;
}

}  // namespace

void ring_attention_backward(MPI_Comm user_comm, TensorView<float> dq, TensorView<float> dk, TensorView<float> dv,
                             TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                             TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                             const RingOptions& options) {
  const ring::Plan plan = ring::make_plan(user_comm, q, k, v, options, [&](const AttentionShape& s) {
    detail::check_backward_outputs(s, dq.shape(), dk.shape(), dv.shape(), TensorView<float>(), dout.shape());
    require_shape(out.shape(), std::array<int64_t, 4>{s.B, s.H, s.N, s.Dv}, "ring attention backward: out");
    if (lse.empty() && s.N > 0) throw Error("ring attention backward: lse is required (the forward's lse)");
    if (!lse.empty())
      require_shape(lse.shape(), std::array<int64_t, 3>{s.B, s.H, s.N}, "ring attention backward: lse");
  });
  ring::CommDup comm(user_comm);
  const int P = plan.ranks, r = plan.rank;
  const int left = (r - 1 + P) % P, right = (r + 1) % P;
  const int threads = options.attention.num_threads > 0 ? options.attention.num_threads : default_num_threads();
  const int64_t Mr = plan.kv_tokens(r);

  ring::fill_zero(dq, threads);
  const int64_t qmax = max_chunk(plan.q_chunks), kmax = max_chunk(plan.kv_chunks);
  Tensor<float> dq_block({plan.B * plan.H * qmax * plan.D}, "ring attention block dq");
  Tensor<float> dk_block({plan.B * plan.Hkv * kmax * plan.D}, "ring attention block dk");
  Tensor<float> dv_block({plan.B * plan.Hkv * kmax * plan.Dv}, "ring attention block dv");
  auto buffer = [&] { return Tensor<float>({plan.max_kv_floats()}, "ring attention K/V buffer"); };
  Tensor<float> kv[2] = {buffer(), buffer()};
  // Gradient sums: `local` is this step's contribution, `in` the sum arriving from the left,
  // `sending` the sum on its way to the right; they rotate so no buffer is reused in flight.
  Tensor<float> grad_storage[3] = {buffer(), buffer(), buffer()};
  float* local = grad_storage[0].data();
  float* in = grad_storage[1].data();
  float* sending = grad_storage[2].data();
  ring::copy_into(ring::packed_k(plan, kv[0].data(), r, 0, Mr), k, threads);
  ring::copy_into(ring::packed_v(plan, kv[0].data(), r, 0, Mr), v, threads);

  ring::Transfers kv_transfers, grad_in, grad_out;
  for (int s = 0; s < P; ++s) {
    const int src = (r - s + P) % P;
    float* current = kv[s % 2].data();
    if (s + 1 < P) {
      kv_transfers.recv(kv[(s + 1) % 2].data(), plan.kv_floats((r - s - 1 + P) % P), left, kTagKV, comm.get());
      kv_transfers.send(current, plan.kv_floats(src), right, kTagKV, comm.get());
    }
    std::fill_n(local, plan.kv_floats(src), 0.0f);
    for (const ring::Chunk& qc : plan.q_chunks[r]) {
      for (const ring::Chunk& kc : plan.kv_chunks[src]) {
        const AttentionOptions block = ring::block_options(plan, options, qc, kc);
        if (!ring::block_has_work(block, plan, qc, kc)) continue;
        const int64_t n = qc.global.size(), m = kc.global.size();
        TensorView<float> bdq(dq_block.data(), {plan.B, plan.H, n, plan.D});
        TensorView<float> bdk(dk_block.data(), {plan.B, plan.Hkv, m, plan.D});
        TensorView<float> bdv(dv_block.data(), {plan.B, plan.Hkv, m, plan.Dv});
        attention_backward(bdq, bdk, bdv, TensorView<float>(), ring::rows(dout, qc.offset, n),
                           ring::rows(q, qc.offset, n), ring::packed_k(plan, current, src, kc.offset, m),
                           ring::packed_v(plan, current, src, kc.offset, m), ring::rows(out, qc.offset, n),
                           ring::rows(lse, qc.offset, n), block);
        ring::add_into(ring::rows(dq, qc.offset, n), bdq, threads);
        ring::add_into(ring::packed_k(plan, local, src, kc.offset, m), bdk, threads);
        ring::add_into(ring::packed_v(plan, local, src, kc.offset, m), bdv, threads);
      }
    }
    if (P > 1) {
      // The sum for src so far (ranks src .. r-1) plus this rank's part, always in that order.
      if (s > 0) {
        grad_in.wait();
        add_flat(in, local, plan.kv_floats(src), threads);
        std::swap(in, local);
      }
      grad_out.wait();
      std::swap(sending, local);
      grad_out.send(sending, plan.kv_floats(src), right, kTagGrad, comm.get());
      // Step s + 1's sum, or after the last step this rank's own finished dK/dV.
      grad_in.recv(in, plan.kv_floats((r - s - 1 + P) % P), left, kTagGrad, comm.get());
    }
    kv_transfers.wait();
  }
  grad_in.wait();
  grad_out.wait();
  float* finished = P > 1 ? in : local;
  ring::copy_into(dk, ring::packed_k(plan, finished, r, 0, Mr), threads);
  ring::copy_into(dv, ring::packed_v(plan, finished, r, 0, Mr), threads);
}

}  // namespace qkv
