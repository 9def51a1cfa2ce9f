// Ring attention backward (as ring-flash-attention does it): the K/V shards travel the ring as in
// the forward, and with each shard travels the running sum of its dK/dV. At step s rank r holds
// the K/V of rank src = (r - s) mod P, computes the fused backward of its query chunks against it
// (the calls of ring::step_calls; P recomputed from the forward's lse), adds dq into its own dq,
// then adds its dK/dV to the sum received from r - 1 and sends it on to r + 1; after P steps each
// sum reaches its owner. Every sum is taken in ring order, fixed for a given P, so results do not
// depend on threads or timing. A first contribution is written in place (adding it to 0 copies it).
#include <fmt/format.h>

#include <optional>
#include <utility>
#include <vector>

#include "attention/backward_checks.h"
#include "distributed/ring_common.h"

namespace qkv {
namespace {

constexpr int kTagKV = 0x4b56;
constexpr int kTagGrad = 0x6447;

void add_flat(float* dst, const float* src, int64_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
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
    if (!lse.empty()) require_shape(lse.shape(), std::array<int64_t, 3>{s.B, s.H, s.N}, "ring attention backward: lse");
  });
  ring::CommDup comm(user_comm);
  const int P = plan.ranks, r = plan.rank;
  const int left = (r - 1 + P) % P, right = (r + 1) % P;
  const int threads = resolve_num_threads(options.attention.num_threads);
  const int64_t Mr = plan.kv_tokens(r);

  const int64_t shard = plan.max_kv_floats();
  // Every rank's buffers before the first transfer (ring::LocalFault, as in the forward).
  ring::LocalFault fault;
  // kv: this step's K/V shard and the next. Gradient sums: `local` is this step's contribution,
  // `in` the sum arriving from the left, `sending` the sum on its way to the right; they rotate so
  // no buffer is reused in flight.
  std::vector<ring::Scratch> kv, grad_storage;
  ring::ShardAt own{};
  std::optional<ring::BackwardSteps> steps;
  fault.run([&] {
    for (int b = 0; b < 2; ++b) kv.emplace_back(shard, "ring attention K/V buffer");
    for (int b = 0; b < 3; ++b) grad_storage.emplace_back(shard, "ring attention dK/dV buffer");
    own = ring::own_shard(plan, k, v, kv[0].data(), threads);
    steps.emplace(plan, options, dq, dout, q, out, lse);
  });
  fault.settle(comm.get());
  float* local = grad_storage[0].data();
  float* in = grad_storage[1].data();
  float* sending = grad_storage[2].data();
  // The last hop brings this rank's finished dK/dV: straight into dk and dv when they are
  // contiguous, else into a buffer copied out at the end.
  const bool grads_in_place = P > 1 && dk.is_contiguous() && dv.is_contiguous();

  ring::Transfers kv_transfers, grad_in, grad_out;
  for (int s = 0; s < P; ++s) {
    const int src = (r - s + P) % P;
    const int next_src = (r - s - 1 + P) % P;
    // The shard at hand: this rank's own at step 0, else the one received into kv[s % 2].
    const ring::ShardAt current = s == 0 ? own : ring::packed_shard(plan, kv[s % 2].data(), src);
    if (s + 1 < P) {
      float* next = kv[(s + 1) % 2].data();
      kv_transfers.recv_shard(plan, next_src, next, next + plan.k_floats(next_src), left, kTagKV, comm.get());
      kv_transfers.send_shard(plan, src, current, right, kTagKV, comm.get());
      kv_transfers.poll(ring::kPollSeconds);
    }
    fault.run([&] { steps->step(src, current, local, local + plan.k_floats(src)); });
    if (P > 1) {
      // The sum for src so far (ranks src .. r-1) plus this rank's part, always in that order.
      if (s > 0) {
        grad_in.wait();
        add_flat(in, local, plan.kv_floats(src), threads);
        std::swap(in, local);
      }
      grad_out.wait();
      std::swap(sending, local);
      grad_out.send_shard(plan, src, ring::packed_shard(plan, sending, src), right, kTagGrad, comm.get());
      // Step s + 1's sum, or after the last step this rank's own finished dK/dV.
      if (s + 1 == P && grads_in_place)
        grad_in.recv_shard(plan, r, dk.data(), dv.data(), left, kTagGrad, comm.get());
      else
        grad_in.recv_shard(plan, next_src, in, in + plan.k_floats(next_src), left, kTagGrad, comm.get());
    }
    kv_transfers.wait();
  }
  fault.run([&] { steps->finish(); });
  grad_in.wait();
  grad_out.wait();
  fault.settle(comm.get());
  if (grads_in_place) return;
  float* finished = P > 1 ? in : local;
  ring::copy_into(dk, ring::packed_k(plan, finished, r, 0, Mr), threads);
  ring::copy_into(dv, ring::packed_v(plan, finished, r, 0, Mr), threads);
}

}  // namespace qkv
