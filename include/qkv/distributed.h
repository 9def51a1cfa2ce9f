// Sequence-parallel attention over MPI (ring attention, Liu et al. 2023): each rank of a
// communicator holds a shard of the query sequence and a shard of the key/value sequence; the K/V
// shards travel around the ring (non-blocking sends overlapped with the local fused block
// computation) and the partial outputs merge by log-sum-exp. Built only when CMake finds MPI
// (library qkv_distributed). Letters as in attention.h; N and M are the GLOBAL sequence lengths.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/attention.h"

namespace qkv {

// How a sequence of L tokens is cut over P ranks. contiguous: rank r holds chunk r of P.
// zigzag: the sequence is cut into 2P chunks and rank r holds chunks r and 2P-1-r, so under a
// causal mask every rank does the same work. Chunks differ in size by at most one token when L is
// not a multiple of the chunk count; a rank may hold zero tokens.
enum class Sharding { contiguous, zigzag };

// A half-open range [begin, end) of global token positions.
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The ranges held by `rank` (in the order they are stored in the shard) for L tokens over `ranks`.
// Pure function of its arguments; throws qkv::Error for ranks < 1, rank outside [0, ranks) or L < 0.
std::vector<TokenRange> shard_ranges(int64_t length, int ranks, int rank, Sharding sharding);
// The sum of the sizes of shard_ranges(...).
int64_t shard_length(int64_t length, int ranks, int rank, Sharding sharding);

// Copies the tokens of `rank` from `full` [A0, A1, L, C] (sequence on axis 2) into `shard`
// [A0, A1, shard_length, C], and back. Any strides. Throws qkv::Error on a shape mismatch.
void shard_sequence(TensorView<float> shard, TensorView<const float> full, int ranks, int rank, Sharding sharding);
void unshard_sequence(TensorView<float> full, TensorView<const float> shard, int ranks, int rank, Sharding sharding);

struct RingOptions {
  // Scale, kernel, threads and SIMD path of the local block computations, and the mask in GLOBAL
  // positions: causal (either alignment), window, key_lengths, query_lengths, ALiBi and softcap.
  // keep, bias and diagonal_offsets are refused (they would need the whole N×M on every rank).
  AttentionOptions attention;
  Sharding sharding = Sharding::zigzag;
};

// Forward ring attention. On every rank of `comm` (a collective call; every rank must call it
// with the same options): q [B,H,Nr,D], k [B,Hkv,Mr,D], v [B,Hkv,Mr,Dv] hold the tokens
// shard_ranges(N, P, rank) and shard_ranges(M, P, rank) of the global sequences, where N and M
// are the sums of Nr and Mr over the ranks. out [B,H,Nr,Dv] and lse [B,H,Nr] (may be empty) receive
// this rank's rows of attention over the whole sequence. Any strides.
// Partials merge in fp32 in ring order, so for a fixed rank count the result is bitwise the same
// for any thread count and run. Memory per rank: O((Nr + Mr)·(D + Dv)·B·H), never N×M or N·D.
// Errors: a bad argument on ANY rank (shapes, options, shard sizes that do not match the layout,
// ranks that disagree on B, H, Hkv, D, Dv or the options) makes every rank throw AgreedError with
// a message naming the first failing rank; no rank is left waiting. An MPI failure throws
// qkv::Error (on the ranks that see it).
// Thread safety: the calling thread alone makes MPI calls (MPI_THREAD_FUNNELED suffices).
void ring_attention_forward(MPI_Comm comm, TensorView<float> out, TensorView<float> lse, TensorView<const float> q,
                            TensorView<const float> k, TensorView<const float> v, const RingOptions& options = {});

// Backward ring attention: dq [B,H,Nr,D], dk [B,Hkv,Mr,D], dv [B,Hkv,Mr,Dv] are overwritten with
// this rank's shard of the gradients, given dout and the forward's out and lse (lse required).
// dK/dV travel the ring with their K/V shard and are summed in ring order; P is recomputed from lse.
// Same collective, determinism and error contract as the forward.
void ring_attention_backward(MPI_Comm comm, TensorView<float> dq, TensorView<float> dk, TensorView<float> dv,
                             TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                             TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                             const RingOptions& options = {});

// An error every rank of the communicator throws alike, with the same message, so a program can
// report it once (from rank 0) rather than once per rank.
class AgreedError : public Error {
 public:
  using Error::Error;
};

// Collective error agreement for code around the ring (file loading, CLI): every rank passes its
// own status (empty = ok); if any rank failed, every rank throws AgreedError carrying the first
// failing rank's message ("rank r: ..."). Returns normally on every rank only if all succeeded.
void agree_or_throw(MPI_Comm comm, const std::string& local_error);

}  // namespace qkv
