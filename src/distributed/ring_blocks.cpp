// The attention calls of one ring step. Each (query chunk, key chunk) pair is a block with the
// global mask in block positions; blocks that the mask keeps whole and that tile one rectangle of
// the shards run as a single call, because every call on a small block pays for partial tiles,
// band evaluation and its own merge (S4 causal with P = 2 ran four 1024-token calls a step where
// the single-process kernel makes one, and reached 0.86 of it).
#include <algorithm>
#include <utility>

#include "distributed/ring_common.h"
#include "kernels/mask_eval.h"

namespace qkv::ring {
namespace {

enum class Visibility { none, partial, full };

// none: the block's mask removes every (query, key) pair; full: it keeps every pair of every
// batch row; partial otherwise. Decided from the evaluated bands, so causal, window and both
// lengths count alike.
Visibility visibility(const AttentionOptions& block, const Plan& plan, const Chunk& qc, const Chunk& kc) {
  if (qc.global.size() == 0 || kc.global.size() == 0) return Visibility::none;
  const AttentionShape s{plan.B, plan.H, plan.Hkv, qc.global.size(), kc.global.size(), plan.D, plan.Dv};
  const detail::MaskEval eval(block.mask, s);
  bool any = false, all = true;
  for (int64_t b = 0; b < plan.B; ++b)
    for (int64_t i = 0; i < s.N; ++i) {
      const detail::KeyBand band = eval.band(b, i);
      any = any || !band.empty();
      all = all && band.lo == 0 && band.hi == s.M;
    }
  return !any ? Visibility::none : all ? Visibility::full : Visibility::partial;
}

// The options of a call over blocks that keep every pair: no positional mask is left, only the
// elementwise softcap (keep and bias are refused by make_plan, ALiBi never coalesces).
AttentionOptions whole_block_options(const RingOptions& options) {
  AttentionOptions o = options.attention;
  o.partial_rows = true;
  o.mask = Mask{};
  o.mask.softcap = options.attention.mask.softcap;
  return o;
}

// The first and one-past-last index of the used chunks if they are consecutive (then their rows
// are one run of the shard, as chunks are stored in order); {0, 0} if they are not.
std::pair<int, int> consecutive(const std::vector<bool>& used) {
  const auto first = std::find(used.begin(), used.end(), true);
  const auto last = std::find(used.rbegin(), used.rend(), true).base();
  if (first >= last || std::find(first, last, false) != last) return {0, 0};
  return {static_cast<int>(first - used.begin()), static_cast<int>(last - used.begin())};
}

int64_t rows_of(const std::vector<Chunk>& chunks, int first, int end) {
  int64_t n = 0;
  for (int c = first; c < end; ++c) n += chunks[c].global.size();
  return n;
}

}  // namespace

AttentionOptions block_options(const Plan& plan, const RingOptions& options, const Chunk& qc, const Chunk& kc) {
  const Mask& g = options.attention.mask;
  AttentionOptions o = options.attention;
  o.partial_rows = true;
  Mask& m = o.mask;
  // The block keeps the global diagonal through diagonal_offsets; alignment is folded into it.
  if (g.causal) m.causal = CausalAlign::top_left;
  m.diagonal = CausalAlign::top_left;
  m.key_lengths.clear();
  m.query_lengths.clear();
  for (int64_t b = 0; b < plan.B; ++b) {
    const int64_t valid_keys = g.key_lengths.empty() ? plan.M : g.key_lengths[b];
    const int64_t valid_queries = g.query_lengths.empty() ? plan.N : g.query_lengths[b];
    const int64_t align = g.align() == CausalAlign::bottom_right ? valid_keys - valid_queries : 0;
    m.diagonal_offsets.push_back(qc.global.begin - kc.global.begin + align);
    if (!g.key_lengths.empty())
      m.key_lengths.push_back(std::clamp<int64_t>(valid_keys - kc.global.begin, 0, kc.global.size()));
    if (!g.query_lengths.empty())
      m.query_lengths.push_back(std::clamp<int64_t>(valid_queries - qc.global.begin, 0, qc.global.size()));
  }
  // The block's scale must be the global default 1/sqrt(D), which it is: D is the same.
  return o;
}

std::vector<BlockCall> step_calls(const Plan& plan, const RingOptions& options, int src) {
  const std::vector<Chunk>& qcs = plan.q_chunks[plan.rank];
  const std::vector<Chunk>& kcs = plan.kv_chunks[src];
  std::vector<BlockCall> calls;
  std::vector<bool> q_used(qcs.size()), k_used(kcs.size());
  // ALiBi depends on the distance to the diagonal, which differs from block to block.
  bool whole = options.attention.mask.alibi_slopes.empty();
  for (int qi = 0; qi < static_cast<int>(qcs.size()); ++qi)
    for (int ki = 0; ki < static_cast<int>(kcs.size()); ++ki) {
      const Chunk &qc = qcs[qi], &kc = kcs[ki];
      AttentionOptions block = block_options(plan, options, qc, kc);
      const Visibility vis = visibility(block, plan, qc, kc);
      if (vis == Visibility::none) continue;
      whole = whole && vis == Visibility::full;
      q_used[qi] = k_used[ki] = true;
      calls.push_back({qi, qi + 1, ki, ki + 1, qc.offset, qc.global.size(), kc.offset, kc.global.size(), block});
    }
  if (!whole || calls.empty()) return calls;
  // One call over the rectangle, if the blocks fill it: used query chunks × used key chunks.
  const auto [q_first, q_end] = consecutive(q_used);
  const auto [k_first, k_end] = consecutive(k_used);
  if (q_first == q_end || k_first == k_end ||
      static_cast<int64_t>(calls.size()) != int64_t{q_end - q_first} * (k_end - k_first))
    return calls;
  return {{q_first, q_end, k_first, k_end, qcs[q_first].offset, rows_of(qcs, q_first, q_end), kcs[k_first].offset,
           rows_of(kcs, k_first, k_end), whole_block_options(options)}};
}

bool Accumulators::claim(int first, int end) {
  const auto begin = written_.begin() + first, stop = written_.begin() + end;
  const bool fresh = std::none_of(begin, stop, [](bool w) { return w; });
  for (int c = first; c < end; ++c)
    if (!fresh && !written_[c]) clear_(c);
  std::fill(begin, stop, true);
  return fresh;
}

void Accumulators::finish() {
  for (std::size_t c = 0; c < written_.size(); ++c)
    if (!written_[c]) clear_(static_cast<int>(c));
}

}  // namespace qkv::ring
