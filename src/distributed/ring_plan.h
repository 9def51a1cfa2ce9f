// The transport-free pieces of a ring call: the plan every rank agrees on (shapes, global lengths,
// the chunks of every rank), the attention calls of one ring step (blocks of query chunk × key
// chunk with the global mask in block positions), and the steps themselves, which the MPI ring
// (ring_forward.cpp, ring_backward.cpp) and qkv.torch's torch.distributed ring both run, so the two
// compute the same thing in the same order.
#pragma once

#include <array>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/scratch.h"
#include "qkv/sharding.h"

namespace qkv::ring {

// A chunk of a shard: global token range and its row offset inside the shard.
struct Chunk {
  TokenRange global;
  int64_t offset = 0;
};

// What every rank knows after the agreement: shapes, global lengths and the layout of every rank.
struct Plan {
  int ranks = 1;
  int rank = 0;
  int64_t B = 0, H = 0, Hkv = 0, D = 0, Dv = 0;
  int64_t N = 0, M = 0;
  std::vector<std::vector<Chunk>> q_chunks;   // per rank
  std::vector<std::vector<Chunk>> kv_chunks;  // per rank
  int64_t max_kv_tokens = 0;
  int64_t q_tokens(int r) const;
  int64_t kv_tokens(int r) const;
  // Floats of rank r's K/V shard as the wire carries it: k [B,Hkv,Mr,D], v [B,Hkv,Mr,Dv].
  int64_t k_floats(int r) const { return B * Hkv * kv_tokens(r) * D; }
  int64_t v_floats(int r) const { return B * Hkv * kv_tokens(r) * Dv; }
  int64_t kv_floats(int r) const { return k_floats(r) + v_floats(r); }
  int64_t max_kv_floats() const { return B * Hkv * max_kv_tokens * (D + Dv); }
};

// What each rank contributes to the agreement: B, H, Hkv, D, Dv, Nr, Mr and a fingerprint of each
// group of options every rank must share (kOptionGroups in ring_plan.cpp: scale, mask, dropout,
// kernel, sharding), so a mismatch names its group.
constexpr int kPlanFields = 12;
using PlanRow = std::array<int64_t, kPlanFields>;
// This rank's row after its local checks (local_checks throws qkv::Error on a bad output shape,
// etc.); throws qkv::Error if an argument is bad.
PlanRow plan_row(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                 const RingOptions& options, const std::function<void(const AttentionShape&)>& local_checks);
// The plan from every rank's row (table: `ranks` rows, in rank order). Every rank runs the same
// checks on the same table, so every rank throws the same AgreedError if the rows disagree.
Plan plan_from_table(std::span<const int64_t> table, int ranks, int rank, const RingOptions& options);

// The options of the block (query chunk qc, key chunk kc): the global mask in block positions.
AttentionOptions block_options(const Plan& plan, const RingOptions& options, const Chunk& qc, const Chunk& kc);

// One attention call of a ring step: this rank's query chunks [q_first, q_end) against key chunks
// [k_first, k_end) of the K/V shard at hand, which are the shard rows [q_offset, q_offset + n)
// and [k_offset, k_offset + m).
struct BlockCall {
  int q_first = 0, q_end = 0, k_first = 0, k_end = 0;
  int64_t q_offset = 0, n = 0, k_offset = 0, m = 0;
  AttentionOptions options;
};
// The calls of the step against the K/V shard of rank src, in a fixed order: one call over the
// rectangle of the chunks with work when they are consecutive, no ALiBi term is on (it depends on
// distances that rectangle positions do not keep) and one causal/window mask in rectangle
// positions gives every row exactly the keys its blocks give it (checked on the evaluated bands,
// so key and query lengths count too); else one call per block with work. Zigzag without ALiBi
// or lengths: one call per step, causal or not.
std::vector<BlockCall> step_calls(const Plan& plan, const RingOptions& options, int src);
// Accumulators kept per chunk that start empty (zeros, or 0 and -inf for out and lse) and take
// their first partial result in place: merging it into an empty accumulator would copy it bit for
// bit, so skipping the zeroing and the merge changes no result. clear(c) empties chunk c.
class Accumulators {
 public:
  Accumulators(std::size_t chunks, std::function<void(int)> clear) : written_(chunks), clear_(std::move(clear)) {}
  // Marks chunks [first, end) written. True if none was before: the caller writes in place.
  // Otherwise the ones that were not are cleared, and the caller merges into all of them.
  bool claim(int first, int end);
  // Clears the chunks never written.
  void finish();

 private:
  std::vector<bool> written_;
  std::function<void(int)> clear_;
};

// Rows [offset, offset + len) of a contiguous [B,Hkv,Mr,C] region of rank r's shard at `data`.
template <class T>
TensorView<T> shard_rows(const Plan& plan, T* data, int r, int64_t offset, int64_t len, int64_t C) {
  const int64_t Mr = plan.kv_tokens(r);
  const std::array<int64_t, 4> shape{plan.B, plan.Hkv, len, C};
  const std::array<int64_t, 4> strides{plan.Hkv * Mr * C, Mr * C, C, 1};
  return TensorView<T>(data + offset * C, shape, strides);
}
// Views of a packed K/V shard of rank r at `base` (k, then v right after it): rows
// [offset, offset + len) of k or v.
TensorView<float> packed_k(const Plan& plan, float* base, int r, int64_t offset, int64_t len);
TensorView<float> packed_v(const Plan& plan, float* base, int r, int64_t offset, int64_t len);

// A K/V shard of rank r as two regions, k [B,Hkv,Mr,D] and v [B,Hkv,Mr,Dv], each contiguous but
// not necessarily adjacent: the wire carries them as two messages, so the caller's own
// contiguous k and v go out as they are, with no packed copy (see own_shard).
struct ShardAt {
  const float* k = nullptr;
  const float* v = nullptr;
  TensorView<const float> k_rows(const Plan& plan, int r, int64_t offset, int64_t len) const {
    return shard_rows(plan, k, r, offset, len, plan.D);
  }
  TensorView<const float> v_rows(const Plan& plan, int r, int64_t offset, int64_t len) const {
    return shard_rows(plan, v, r, offset, len, plan.Dv);
  }
};
// The packed shard of rank r at `base`.
ShardAt packed_shard(const Plan& plan, const float* base, int r);
// This rank's own k and v as the ring sends them: the caller's tensors when both are contiguous,
// else copies packed into `buffer` (kv_floats of this rank).
ShardAt own_shard(const Plan& plan, TensorView<const float> k, TensorView<const float> v, float* buffer, int threads);
// Rows [begin, begin + len) of axis 2 of a rank-3 or rank-4 view.
template <class T>
TensorView<T> rows(TensorView<T> t, int64_t begin, int64_t len) {
  std::array<int64_t, 4> shape{}, strides{};
  for (int i = 0; i < t.rank(); ++i) shape[i] = t.dim(i), strides[i] = t.stride(i);
  shape[2] = len;
  const auto n = static_cast<std::size_t>(t.rank());
  return TensorView<T>(t.data() + begin * t.stride(2), std::span<const int64_t>(shape.data(), n),
                       std::span<const int64_t>(strides.data(), n));
}

// The ring's K/V and gradient buffers and block results (core/scratch.h: not zeroed).
using detail::Scratch;

// dst (rank 4, any strides) = src or += src, elementwise; threads split the first two dims, so
// the result does not depend on the thread count.
void copy_into(TensorView<float> dst, TensorView<const float> src, int threads);
void add_into(TensorView<float> dst, TensorView<const float> src, int threads);
void fill_zero(TensorView<float> dst, int threads);

// The forward steps of one rank: step(src, shard) attends this rank's queries to the K/V shard of
// rank src and merges the partial (out, lse) into out by log-sum-exp in fp32; the steps must come
// in ring order (src = rank, rank - 1, ...), which fixes the result for a given rank count. A row's
// first partial is written in place (merging it into an empty accumulator would copy it).
class ForwardSteps {
 public:
  ForwardSteps(const Plan& plan, const RingOptions& options, TensorView<float> out, TensorView<const float> q);
  void step(int src, ShardAt shard);
  // Clears rows no step wrote and copies the log-sum-exp into lse (if not empty).
  void finish(TensorView<float> lse);

 private:
  const Plan& plan_;
  const RingOptions& options_;
  TensorView<float> out_;
  TensorView<const float> q_;
  int threads_;
  std::vector<float> lse_;
  Scratch block_out_, block_lse_;
  Accumulators acc_;
};

// The backward steps of one rank: step(src, shard, dk, dv) adds this rank's dq against the K/V
// shard of rank src into dq and writes this rank's contribution to that shard's dK/dV into dk
// [B,Hkv,Mr,D] and dv [B,Hkv,Mr,Dv] (contiguous). The caller sums them over the ranks in ring
// order. P is recomputed from the forward's lse.
class BackwardSteps {
 public:
  BackwardSteps(const Plan& plan, const RingOptions& options, TensorView<float> dq, TensorView<const float> dout,
                TensorView<const float> q, TensorView<const float> out, TensorView<const float> lse);
  void step(int src, ShardAt shard, float* dk, float* dv);
  // Clears the dq rows no step wrote.
  void finish();

 private:
  const Plan& plan_;
  const RingOptions& options_;
  TensorView<float> dq_;
  TensorView<const float> dout_, q_, out_, lse_;
  int threads_;
  Scratch dq_block_, dk_block_, dv_block_;
  Accumulators dq_acc_;
};

}  // namespace qkv::ring
