// The plan of a ring call from every rank's row, packed shard views and elementwise helpers:
// everything of a ring call but the transport.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>

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

// The groups of options every rank must share, in the order of their fingerprints in a row.
constexpr const char* kOptionGroups[] = {"scale", "mask (causal, window, lengths, ALiBi, softcap)",
                                         "dropout (p, seed, offset)", "kernel", "sharding"};
constexpr int kFirstFingerprint = kPlanFields - static_cast<int>(std::size(kOptionGroups));

// Each group's fingerprint, written into row[kFirstFingerprint...]; the scale as resolved for head
// dim D, so a default and the same value given agree.
void options_fingerprints(const RingOptions& o, int64_t D, int64_t* row) {
  const Mask& m = o.attention.mask;
  Fingerprint scale, mask, dropout, kernel, sharding;
  scale.add(attention_scale(o.attention.scale, D));
  mask.add(m.causal.has_value());
  mask.add(static_cast<int>(m.align()));
  mask.add(m.window.has_value());
  mask.add(m.window.value_or(Window{}).left);
  mask.add(m.window.value_or(Window{}).right);
  mask.add_all(m.key_lengths);
  mask.add_all(m.query_lengths);
  mask.add_all(m.alibi_slopes);
  mask.add(m.softcap);
  const Dropout& d = o.attention.dropout;
  dropout.add(d.p);
  dropout.add(d.seed);
  dropout.add(d.offset);
  dropout.add(d.first_batch);
  dropout.add(d.first_row);
  dropout.add(d.first_key);
  kernel.add(static_cast<int>(o.attention.kernel));
  sharding.add(static_cast<int>(o.sharding));
  int i = kFirstFingerprint;
  for (const Fingerprint& f : {scale, mask, dropout, kernel, sharding}) row[i++] = f.value();
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
    for (int g = kFirstFingerprint; g < kPlanFields; ++g)
      if (row(r)[g] != row(0)[g])
        throw AgreedError(fmt::format("ring attention: rank {} was called with another {} than rank 0", r,
                                      kOptionGroups[g - kFirstFingerprint]));
  }
  for (int r = 0; r < ranks; ++r) plan.N += row(r)[5], plan.M += row(r)[6];
  // Every rank's count against the layout's: N and M are the sums, so the rank that is off may
  // not be the first whose count differs.
  std::vector<int64_t> held_q, held_k, want_q, want_k;
  for (int r = 0; r < ranks; ++r) {
    held_q.push_back(row(r)[5]), held_k.push_back(row(r)[6]);
    want_q.push_back(shard_length(plan.N, ranks, r, options.sharding));
    want_k.push_back(shard_length(plan.M, ranks, r, options.sharding));
  }
  if (held_q != want_q || held_k != want_k)
    throw AgreedError(fmt::format(
        "ring attention: ranks 0 to {} hold [{}] query and [{}] key tokens, but the {} layout of N = {} and M = {} "
        "gives them [{}] and [{}] (see shard_ranges)",
        ranks - 1, fmt::join(held_q, ", "), fmt::join(held_k, ", "),
        options.sharding == Sharding::zigzag ? "zigzag" : "contiguous", plan.N, plan.M, fmt::join(want_q, ", "),
        fmt::join(want_k, ", ")));
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
  PlanRow row{s.B, s.H, s.Hkv, s.D, s.Dv, s.N, s.M};
  options_fingerprints(options, s.D, row.data());
  return row;
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
