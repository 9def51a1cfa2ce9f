// The transport-free half of ring attention: how a sequence is sharded over the ranks of a ring
// and the options of a ring call. qkv/distributed.h runs the ring over MPI; qkv.torch runs the
// same plan over a torch.distributed process group. Letters as in attention.h.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/attention.h"
#include "qkv/error.h"

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

// An error every rank of a ring throws alike, with the same message, so a program can
// report it once (from rank 0) rather than once per rank.
class AgreedError : public Error {
 public:
  using Error::Error;
};

}  // namespace qkv
