// Ring attention forward. Rank r holds its query shard; at step s it holds the K/V shard of rank
// (r - s) mod P, receives the next one from r - 1 and sends the current one to r + 1 while it
// computes the fused attention of its query chunks against the current K/V chunks (the calls of
// ring::step_calls). The partial (out, lse) of each call merges into the running result by
// log-sum-exp in fp32, in ring order, which is fixed for a given P: the result does not depend on
// threads or message timing (ring_plan.h's ForwardSteps).

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "distributed/ring_common.h"

namespace qkv {
namespace {

constexpr int kTagKV = 0x4b56;

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
  // Every rank's buffers before the first transfer: a rank without them could not take its part.
  ring::LocalFault fault;
  std::vector<ring::Scratch> buffers;
  ring::ShardAt own{};
  std::optional<ring::ForwardSteps> steps;
  fault.run([&] {
    for (int b = 0; b < 2; ++b) buffers.emplace_back(plan.max_kv_floats(), "ring attention K/V buffer");
    own = ring::own_shard(plan, k, v, buffers[0].data(), threads);
    steps.emplace(plan, options, out, q);
  });
  fault.settle(comm.get());
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
    fault.run([&] { steps->step(src, current); });
    transfers.wait();
  }
  fault.run([&] { steps->finish(lse); });
  fault.settle(comm.get());
}

}  // namespace qkv
