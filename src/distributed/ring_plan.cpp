// The plan of a ring call from every rank's row, packed shard views and elementwise helpers:
// everything of a ring call but the transport.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "distributed/ring_plan.h"
#include "qkv/options_parse.h"
#include "qkv/out_of_memory.h"

namespace qkv::ring {
namespace {

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
  const Dropout& d = o.attention.dropout;
  f.add(d.p);
  f.add(d.seed);
  f.add(d.offset);
  f.add(d.first_batch);
  f.add(d.first_row);
  f.add(d.first_key);
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

void check_table(std::span<const int64_t> table, int ranks, const RingOptions& options, Plan& plan) {
  auto row = [&](int r) { return table.data() + static_cast<std::size_t>(r) * kPlanFields; };
  for (int r = 1; r < ranks; ++r) {
    if (!std::equal(row(r), row(r) + 5, row(0)))
      throw AgreedError(fmt::format("ring attention: rank {} has [B, H, Hkv, D, Dv] = [{}] but rank 0 has [{}]", r,
                                    fmt::join(row(r), row(r) + 5, ", "), fmt::join(row(0), row(0) + 5, ", ")));
    if (row(r)[7] != row(0)[7])
      throw AgreedError(
          fmt::format("ring attention: rank {} was called with other options (mask, scale, dropout and its "
                      "seed, kernel or sharding) than rank 0",
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
  // The rule of every front end (qkv/options_parse.h), against the global lengths.
  auto check_global = [&](const std::vector<int64_t>& lengths, int64_t limit, const char* what) {
    if (lengths.empty()) return;
    try {
      check_lengths(lengths, row(0)[0], limit, what);
    } catch (const Error& e) {
      throw AgreedError(fmt::format("ring attention: {} (global length)", e.what()));
    }
  };
  check_global(options.attention.mask.key_lengths, plan.M, "key_lengths");
  check_global(options.attention.mask.query_lengths, plan.N, "query_lengths");
}

}  // namespace

int64_t Plan::q_tokens(int r) const { return tokens(q_chunks[r]); }
int64_t Plan::kv_tokens(int r) const { return tokens(kv_chunks[r]); }

PlanRow plan_row(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                 const RingOptions& options, const std::function<void(const AttentionShape&)>& local_checks) {
  const Mask& m = options.attention.mask;
  if (!m.keep.empty() || !m.bias.empty())
    throw Error("ring attention: keep and bias masks are not supported (they are N×M on every rank)");
  if (!m.diagonal_offsets.empty()) throw Error("ring attention: diagonal_offsets is set by the ring itself");
  // Lengths are global; they are checked against the global N and M after the agreement.
  AttentionOptions local = options.attention;
  local.mask.key_lengths.clear();
  local.mask.query_lengths.clear();
  const AttentionShape s = check_attention_shapes(q.shape(), k.shape(), v.shape(), local);
  local_checks(s);
  return {s.B, s.H, s.Hkv, s.D, s.Dv, s.N, s.M, options_fingerprint(options)};
}

Plan plan_from_table(std::span<const int64_t> table, int ranks, int rank, const RingOptions& options) {
  if (ranks < 1 || rank < 0 || rank >= ranks || table.size() != static_cast<std::size_t>(ranks) * kPlanFields)
    throw Error(fmt::format("ring attention: a plan of {} ranks needs {} rows of {} fields, got {} values (rank {})",
                            ranks, ranks, kPlanFields, table.size(), rank));
  Plan plan;
  plan.ranks = ranks;
  plan.rank = rank;
  check_table(table, ranks, options, plan);
  const int64_t* mine = table.data() + static_cast<std::size_t>(rank) * kPlanFields;
  plan.B = mine[0], plan.H = mine[1], plan.Hkv = mine[2], plan.D = mine[3], plan.Dv = mine[4];
  for (int r = 0; r < ranks; ++r) {
    plan.q_chunks.push_back(chunks_of(plan.N, ranks, r, options.sharding));
    plan.kv_chunks.push_back(chunks_of(plan.M, ranks, r, options.sharding));
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

}  // namespace qkv::ring
