// The plan and agreement of a ring call, packed shard views and transfers.
#include "distributed/ring_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>

#include "qkv/out_of_memory.h"

namespace qkv {

void agree_or_throw(MPI_Comm comm, const std::string& local_error) {
  // Fixed-size slots so one allgather carries every rank's verdict and message.
  constexpr int kSlot = 1024;
  int ranks = 1;
  ring::check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  std::array<char, kSlot> mine{};
  if (!local_error.empty()) {
    mine[0] = 1;
    std::memcpy(mine.data() + 1, local_error.data(), std::min<std::size_t>(local_error.size(), kSlot - 2));
  }
  std::vector<char> all(static_cast<std::size_t>(ranks) * kSlot);
  ring::check_mpi(MPI_Allgather(mine.data(), kSlot, MPI_CHAR, all.data(), kSlot, MPI_CHAR, comm), "MPI_Allgather");
  for (int r = 0; r < ranks; ++r) {
    const char* slot = all.data() + static_cast<std::size_t>(r) * kSlot;
    if (slot[0] != 0) throw AgreedError(fmt::format("rank {}: {}", r, slot + 1));
  }
}

namespace ring {
namespace {

constexpr int64_t kMaxMessage = int64_t{1} << 30;

// FNV-1a over the options every rank must share (the mask in global positions, scale, kernel,
// sharding); threads and SIMD path may differ per rank.
class Fingerprint {
 public:
  template <class T>
  void add(const T& x) {
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &x, sizeof(T));
    for (unsigned char c : bytes) hash_ = (hash_ ^ c) * 1099511628211ull;
  }
  template <class T>
  void add_all(const std::vector<T>& xs) {
    add(xs.size());
    for (const T& x : xs) add(x);
  }
  int64_t value() const { return static_cast<int64_t>(hash_); }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};

int64_t options_fingerprint(const RingOptions& o) {
  const Mask& m = o.attention.mask;
  Fingerprint f;
  f.add(o.attention.scale.has_value());
  f.add(o.attention.scale.value_or(0.0));
  f.add(m.causal.has_value());
  f.add(static_cast<int>(m.align()));
  f.add(m.window.has_value());
  f.add(m.window.value_or(Window{}).left);
  f.add(m.window.value_or(Window{}).right);
  f.add_all(m.key_lengths);
  f.add_all(m.query_lengths);
  f.add_all(m.alibi_slopes);
  f.add(m.softcap);
  f.add(static_cast<int>(o.attention.kernel));
  f.add(static_cast<int>(o.sharding));
  return f.value();
}

std::vector<Chunk> chunks_of(int64_t length, int ranks, int rank, Sharding sharding) {
  std::vector<Chunk> out;
  int64_t offset = 0;
  for (const TokenRange& r : shard_ranges(length, ranks, rank, sharding)) {
    out.push_back({r, offset});
    offset += r.size();
  }
  return out;
}

int64_t tokens(const std::vector<Chunk>& chunks) {
  int64_t n = 0;
  for (const Chunk& c : chunks) n += c.global.size();
  return n;
}

// The agreed table: per rank B, H, Hkv, D, Dv, Nr, Mr, fingerprint.
constexpr int kFields = 8;

void check_table(const std::vector<int64_t>& table, int ranks, const RingOptions& options, Plan& plan) {
  auto row = [&](int r) { return table.data() + static_cast<std::size_t>(r) * kFields; };
  for (int r = 1; r < ranks; ++r) {
    if (!std::equal(row(r), row(r) + 5, row(0)))
      throw AgreedError(fmt::format("ring attention: rank {} has [B, H, Hkv, D, Dv] = [{}] but rank 0 has [{}]", r,
                                    fmt::join(row(r), row(r) + 5, ", "), fmt::join(row(0), row(0) + 5, ", ")));
    if (row(r)[7] != row(0)[7])
      throw AgreedError(
          fmt::format("ring attention: rank {} was called with other options (mask, scale, kernel or "
                      "sharding) than rank 0",
                      r));
  }
  for (int r = 0; r < ranks; ++r) plan.N += row(r)[5], plan.M += row(r)[6];
  const char* name = options.sharding == Sharding::zigzag ? "zigzag" : "contiguous";
  for (int r = 0; r < ranks; ++r) {
    const int64_t nr = shard_length(plan.N, ranks, r, options.sharding);
    const int64_t mr = shard_length(plan.M, ranks, r, options.sharding);
    if (row(r)[5] != nr || row(r)[6] != mr)
      throw AgreedError(
          fmt::format("ring attention: rank {} holds {} query and {} key tokens, but the {} layout of N = {} "
                      "and M = {} over {} ranks gives it {} and {} (see shard_ranges)",
                      r, row(r)[5], row(r)[6], name, plan.N, plan.M, ranks, nr, mr));
  }
  auto check_lengths = [](const std::vector<int64_t>& lengths, int64_t limit, const char* what) {
    for (std::size_t b = 0; b < lengths.size(); ++b)
      if (lengths[b] < 0 || lengths[b] > limit)
        throw AgreedError(
            fmt::format("ring attention: {}[{}] = {} is outside [0, {}] (global length)", what, b, lengths[b], limit));
  };
  check_lengths(options.attention.mask.key_lengths, plan.M, "key_lengths");
  check_lengths(options.attention.mask.query_lengths, plan.N, "query_lengths");
}

}  // namespace

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(fmt::format("{} failed: {}", what, text));
}

int64_t Plan::q_tokens(int r) const { return tokens(q_chunks[r]); }
int64_t Plan::kv_tokens(int r) const { return tokens(kv_chunks[r]); }

Plan make_plan(MPI_Comm comm, TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
               const RingOptions& options, const std::function<void(const AttentionShape&)>& local_checks) {
  Plan plan;
  check_mpi(MPI_Comm_size(comm, &plan.ranks), "MPI_Comm_size");
  check_mpi(MPI_Comm_rank(comm, &plan.rank), "MPI_Comm_rank");
  std::array<int64_t, kFields> mine{};
  std::string error;
  try {
    const Mask& m = options.attention.mask;
    if (!m.keep.empty() || !m.bias.empty())
      throw Error("ring attention: keep and bias masks are not supported (they are N×M on every rank)");
    if (!m.diagonal_offsets.empty()) throw Error("ring attention: diagonal_offsets is set by the ring itself");
    // The keep-mask is keyed by a row's and a key's index in one call; the ring's block calls
    // index their shards, so each would drop a different mask than the single-process call.
    if (options.attention.dropout.active()) throw Error("ring attention: dropout is not supported");
    // Lengths are global; they are checked against the global N and M after the agreement.
    AttentionOptions local = options.attention;
    local.mask.key_lengths.clear();
    local.mask.query_lengths.clear();
    const AttentionShape s = check_attention_shapes(q.shape(), k.shape(), v.shape(), local);
    local_checks(s);
    mine = {s.B, s.H, s.Hkv, s.D, s.Dv, s.N, s.M, options_fingerprint(options)};
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(comm, error);
  std::vector<int64_t> table(static_cast<std::size_t>(plan.ranks) * kFields);
  check_mpi(MPI_Allgather(mine.data(), kFields, MPI_INT64_T, table.data(), kFields, MPI_INT64_T, comm),
            "MPI_Allgather");
  // Every rank runs the same checks on the same table, so every rank throws the same error.
  check_table(table, plan.ranks, options, plan);
  plan.B = mine[0], plan.H = mine[1], plan.Hkv = mine[2], plan.D = mine[3], plan.Dv = mine[4];
  for (int r = 0; r < plan.ranks; ++r) {
    plan.q_chunks.push_back(chunks_of(plan.N, plan.ranks, r, options.sharding));
    plan.kv_chunks.push_back(chunks_of(plan.M, plan.ranks, r, options.sharding));
    plan.max_kv_tokens = std::max(plan.max_kv_tokens, plan.kv_tokens(r));
  }
  return plan;
}

TensorView<float> packed_k(const Plan& plan, float* base, int r, int64_t offset, int64_t len) {
  return shard_rows(plan, base, r, offset, len, plan.D);
}
TensorView<float> packed_v(const Plan& plan, float* base, int r, int64_t offset, int64_t len) {
  return shard_rows(plan, base + plan.k_floats(r), r, offset, len, plan.Dv);
}

ShardAt packed_shard(const Plan& plan, const float* base, int r) { return {base, base + plan.k_floats(r)}; }

ShardAt own_shard(const Plan& plan, TensorView<const float> k, TensorView<const float> v, float* buffer, int threads) {
  if (k.is_contiguous() && v.is_contiguous()) return {k.data(), v.data()};
  const int64_t Mr = plan.kv_tokens(plan.rank);
  copy_into(packed_k(plan, buffer, plan.rank, 0, Mr), k, threads);
  copy_into(packed_v(plan, buffer, plan.rank, 0, Mr), v, threads);
  return packed_shard(plan, buffer, plan.rank);
}

Scratch::Scratch(int64_t floats, const char* what) {
  const std::size_t bytes = (static_cast<std::size_t>(std::max<int64_t>(floats, 1)) * sizeof(float) + 63) / 64 * 64;
  data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
  if (data_ == nullptr) throw OutOfMemory(what, bytes);
}

namespace {
template <class Op>
void elementwise(TensorView<float> dst, TensorView<const float> src, int threads, Op op) {
  const int64_t outer = dst.dim(0) * dst.dim(1), C = dst.dim(3);
  // Rows of unit stride (the packed shards, contiguous user tensors) get a loop the compiler
  // vectorizes; indexing every element through the view ran at a fraction of memory speed.
  const bool unit = dst.stride(3) == 1 && src.stride(3) == 1;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t ab = 0; ab < outer; ++ab) {
    const int64_t a = ab / dst.dim(1), b = ab % dst.dim(1);
    for (int64_t i = 0; i < dst.dim(2); ++i) {
      float* d = &dst(a, b, i, 0);
      const float* s = &src(a, b, i, 0);
      if (unit) {
        for (int64_t c = 0; c < C; ++c) op(d[c], s[c]);
      } else {
        for (int64_t c = 0; c < C; ++c) op(d[c * dst.stride(3)], s[c * src.stride(3)]);
      }
    }
  }
}
}  // namespace

void copy_into(TensorView<float> dst, TensorView<const float> src, int threads) {
  elementwise(dst, src, threads, [](float& d, float s) { d = s; });
}
void add_into(TensorView<float> dst, TensorView<const float> src, int threads) {
  elementwise(dst, src, threads, [](float& d, float s) { d += s; });
}
void fill_zero(TensorView<float> dst, int threads) {
  elementwise(dst, dst, threads, [](float& d, float) { d = 0.0f; });
}

namespace {

// Posts `count` floats as messages of at most kMaxMessage each (an MPI count is an int) through
// post(offset, n, &request), keeping every request for Transfers::wait.
template <class Post>
void post_chunks(std::vector<MPI_Request>& requests, int64_t count, const char* what, Post post) {
  for (int64_t done = 0; done < count; done += kMaxMessage) {
    MPI_Request request;
    check_mpi(post(done, static_cast<int>(std::min(kMaxMessage, count - done)), &request), what);
    requests.push_back(request);
  }
}

}  // namespace

void Transfers::send(const float* data, int64_t count, int to, int tag, MPI_Comm comm) {
  post_chunks(requests_, count, "MPI_Isend",
              [&](int64_t at, int n, MPI_Request* r) { return MPI_Isend(data + at, n, MPI_FLOAT, to, tag, comm, r); });
}

void Transfers::recv(float* data, int64_t count, int from, int tag, MPI_Comm comm) {
  post_chunks(requests_, count, "MPI_Irecv", [&](int64_t at, int n, MPI_Request* r) {
    return MPI_Irecv(data + at, n, MPI_FLOAT, from, tag, comm, r);
  });
}

void Transfers::send_shard(const Plan& plan, int r, ShardAt shard, int to, int tag, MPI_Comm comm) {
  send(shard.k, plan.k_floats(r), to, tag, comm);
  send(shard.v, plan.v_floats(r), to, tag, comm);
}

void Transfers::recv_shard(const Plan& plan, int r, float* k, float* v, int from, int tag, MPI_Comm comm) {
  recv(k, plan.k_floats(r), from, tag, comm);
  recv(v, plan.v_floats(r), from, tag, comm);
}

void Transfers::wait() {
  if (requests_.empty()) return;
  const int rc = MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  requests_.clear();
  check_mpi(rc, "MPI_Waitall");
}

void Transfers::poll(double seconds) {
  const double until = MPI_Wtime() + seconds;
  int done = 0;
  while (!requests_.empty() && !done) {
    check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (done) requests_.clear();
    if (MPI_Wtime() > until) break;
  }
}

Transfers::~Transfers() {
  // Only reached with requests outstanding when an exception unwinds; the buffers die with us.
  for (MPI_Request& r : requests_) {
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
}

CommDup::CommDup(MPI_Comm comm) { check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup"); }
CommDup::~CommDup() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

}  // namespace ring
}  // namespace qkv
