// Pieces shared by the ring forward and backward: the validated plan of a ring call (agreed by
// every rank), K/V shards packed for the wire, the mask of one (query chunk, key chunk) block in
// block-local positions, and non-blocking transfers of any size.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "qkv/distributed.h"

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
  // Floats of one packed K/V shard of rank r: k [B,Hkv,Mr,D] then v [B,Hkv,Mr,Dv].
  int64_t kv_floats(int r) const { return B * Hkv * kv_tokens(r) * (D + Dv); }
  int64_t max_kv_floats() const { return B * Hkv * max_kv_tokens * (D + Dv); }
};

// Validates one rank's arguments (local_checks throws qkv::Error on a bad output shape, etc.),
// agrees with every rank on shapes and options, and returns the plan. Throws the same qkv::Error
// on every rank if any rank is wrong.
Plan make_plan(MPI_Comm comm, TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
               const RingOptions& options, const std::function<void(const AttentionShape&)>& local_checks);

// The options of the block (query chunk qc, key chunk kc): the global mask in block positions.
AttentionOptions block_options(const Plan& plan, const RingOptions& options, const Chunk& qc, const Chunk& kc);
// True if the block's mask leaves at least one (query, key) pair.
bool block_has_work(const AttentionOptions& block, const Plan& plan, const Chunk& qc, const Chunk& kc);

// Views of a packed K/V shard of rank r at `base`: k or v rows [offset, offset + len).
TensorView<float> packed_k(const Plan& plan, float* base, int r, int64_t offset, int64_t len);
TensorView<float> packed_v(const Plan& plan, float* base, int r, int64_t offset, int64_t len);
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

// dst (rank 4, any strides) = src or += src, elementwise; threads split the first two dims, so
// the result does not depend on the thread count.
void copy_into(TensorView<float> dst, TensorView<const float> src, int threads);
void add_into(TensorView<float> dst, TensorView<const float> src, int threads);
void fill_zero(TensorView<float> dst, int threads);

// Outstanding non-blocking transfers; messages above 2^30 floats go in several parts.
class Transfers {
 public:
  void send(const float* data, int64_t count, int to, int tag, MPI_Comm comm);
  void recv(float* data, int64_t count, int from, int tag, MPI_Comm comm);
  void wait();
  ~Transfers();

 private:
  std::vector<MPI_Request> requests_;
};

// Throws qkv::Error naming `what` if an MPI call failed.
void check_mpi(int rc, const char* what);

// A duplicate of the caller's communicator for the length of one call, so the ring's messages
// cannot match the caller's own traffic.
class CommDup {
 public:
  explicit CommDup(MPI_Comm comm);
  ~CommDup();
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace qkv::ring
