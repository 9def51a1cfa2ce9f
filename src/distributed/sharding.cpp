// Sequence sharding for ring attention: which global token ranges a rank holds, and copies
// between a whole sequence and one rank's shard (sequence on axis 2).
#include <fmt/format.h>

#include "qkv/sharding.h"

namespace qkv {
namespace {

// Chunk c of `count` equal-as-possible chunks of L tokens.
TokenRange chunk(int64_t length, int64_t count, int64_t c) { return {c * length / count, (c + 1) * length / count}; }

// Calls f(range, offset_in_shard) for each range of the shard, in shard order.
template <class F>
void for_each_range(int64_t length, int ranks, int rank, Sharding sharding, F&& f) {
  int64_t offset = 0;
  for (const TokenRange& r : shard_ranges(length, ranks, rank, sharding)) {
    f(r, offset);
    offset += r.size();
  }
}

template <class Dst, class Src>
void copy_rows(TensorView<Dst> dst, int64_t dst_row, TensorView<Src> src, int64_t src_row, int64_t rows) {
  for (int64_t a = 0; a < dst.dim(0); ++a)
    for (int64_t b = 0; b < dst.dim(1); ++b)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < dst.dim(3); ++c) dst(a, b, dst_row + i, c) = src(a, b, src_row + i, c);
}

void check_pair(std::span<const int64_t> shard, std::span<const int64_t> full, int64_t want, const char* what) {
  if (shard.size() != 4 || full.size() != 4)
    throw Error(fmt::format("{}: shard {} and sequence {} must both be rank 4 [A0, A1, L, C]", what,
                            shape_string(shard), shape_string(full)));
  if (shard[0] != full[0] || shard[1] != full[1] || shard[3] != full[3] || shard[2] != want)
    throw Error(fmt::format("{}: shard {} does not fit sequence {} (this rank holds {} of its {} tokens)", what,
                            shape_string(shard), shape_string(full), want, full[2]));
}

}  // namespace

std::vector<TokenRange> shard_ranges(int64_t length, int ranks, int rank, Sharding sharding) {
  if (ranks < 1) throw Error(fmt::format("shard_ranges: ranks must be at least 1, got {}", ranks));
  if (rank < 0 || rank >= ranks) throw Error(fmt::format("shard_ranges: rank {} is outside [0, {})", rank, ranks));
  if (length < 0) throw Error(fmt::format("shard_ranges: sequence length {} is negative", length));
  if (sharding == Sharding::contiguous) return {chunk(length, ranks, rank)};
  return {chunk(length, 2 * int64_t{ranks}, rank), chunk(length, 2 * int64_t{ranks}, 2 * int64_t{ranks} - 1 - rank)};
}

int64_t shard_length(int64_t length, int ranks, int rank, Sharding sharding) {
  int64_t n = 0;
  for (const TokenRange& r : shard_ranges(length, ranks, rank, sharding)) n += r.size();
  return n;
}

void shard_sequence(TensorView<float> shard, TensorView<const float> full, int ranks, int rank, Sharding sharding) {
  const int64_t want = full.rank() == 4 ? shard_length(full.dim(2), ranks, rank, sharding) : -1;
  check_pair(shard.shape(), full.shape(), want, "shard_sequence");
  for_each_range(full.dim(2), ranks, rank, sharding,
                 [&](TokenRange r, int64_t offset) { copy_rows(shard, offset, full, r.begin, r.size()); });
}

void unshard_sequence(TensorView<float> full, TensorView<const float> shard, int ranks, int rank, Sharding sharding) {
  const int64_t want = full.rank() == 4 ? shard_length(full.dim(2), ranks, rank, sharding) : -1;
  check_pair(shard.shape(), full.shape(), want, "unshard_sequence");
  for_each_range(full.dim(2), ranks, rank, sharding,
                 [&](TokenRange r, int64_t offset) { copy_rows(full, r.begin, shard, offset, r.size()); });
}

}  // namespace qkv
