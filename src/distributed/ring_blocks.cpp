// The attention calls of one ring step. Each (query chunk, key chunk) pair is a block with the
// global mask in block positions; the blocks of a step run as ONE call over the rectangle of their
// chunks whenever one mask in rectangle positions gives every row exactly the keys the blocks give
// it, because every call on a small block pays for partial tiles, band evaluation and its own
// merge (S4 causal with P = 2 ran four 1024-token calls a step where the single-process kernel
// makes one, and reached 0.86 of it). Zigzag makes this the common case: the shard's chunks are
// in global order, so a non-causal step, a causal step off the diagonal (blocks fully visible or
// empty) and even the causal diagonal step (the rectangle is causal in shard positions) are each
// one call.
#include <algorithm>
#include <optional>
#include <utility>

#include "distributed/ring_plan.h"
#include "kernels/mask_eval.h"

namespace qkv::ring {
namespace {

using detail::KeyBand;

// The allowed keys of every (batch row, query) of a block under its own mask, [B][n].
std::vector<KeyBand> block_bands(const AttentionOptions& block, const Plan& plan, const Chunk& qc, const Chunk& kc) {
  const AttentionShape s{plan.B, plan.H, plan.Hkv, qc.global.size(), kc.global.size(), plan.D, plan.Dv};
  const detail::MaskEval eval(block.mask, s);
  std::vector<KeyBand> bands(static_cast<std::size_t>(s.B * s.N));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.N; ++i) bands[b * s.N + i] = eval.band(b, i);
  return bands;
}

bool has_work(const std::vector<KeyBand>& bands) {
  return std::any_of(bands.begin(), bands.end(), [](const KeyBand& band) { return !band.empty(); });
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

struct Block {
  AttentionOptions options;
  std::vector<KeyBand> bands;
};

// The keys every row of the rectangle q chunks [qf, qe) × k chunks [kf, ke) may see, in rectangle
// positions, as the blocks give them; nullopt if some row's keys are not one contiguous run.
std::optional<std::vector<KeyBand>> rectangle_bands(const std::vector<std::vector<Block>>& blocks, const Plan& plan,
                                                    const std::vector<Chunk>& qcs, const std::vector<Chunk>& kcs,
                                                    std::pair<int, int> q, std::pair<int, int> k) {
  const int64_t n = rows_of(qcs, q.first, q.second);
  std::vector<KeyBand> out(static_cast<std::size_t>(plan.B * n));
  for (int64_t b = 0; b < plan.B; ++b) {
    int64_t row = 0;
    for (int qi = q.first; qi < q.second; ++qi)
      for (int64_t i = 0; i < qcs[qi].global.size(); ++i, ++row) {
        KeyBand run;
        int64_t key = 0;  // the first key of chunk ki in the rectangle
        for (int ki = k.first; ki < k.second; key += kcs[ki].global.size(), ++ki) {
          const KeyBand band = blocks[qi][ki].bands[b * qcs[qi].global.size() + i];
          if (band.empty()) continue;
          if (!run.empty() && run.hi != key + band.lo) return std::nullopt;
          if (run.empty()) run.lo = key + band.lo;
          run.hi = key + band.hi;
        }
        out[b * n + row] = run;
      }
  }
  return out;
}

// One mask over the whole rectangle: the global causal and window masks with the diagonal of the
// block (qi, ki) moved to rectangle positions, softcap kept. The caller checks it row by row.
AttentionOptions rectangle_options(const RingOptions& options, const Block& block, int64_t q_at, int64_t k_at) {
  AttentionOptions o = options.attention;
  o.mask = Mask{};
  o.mask.causal = block.options.mask.causal;
  o.mask.window = block.options.mask.window;
  o.mask.softcap = block.options.mask.softcap;
  for (int64_t offset : block.options.mask.diagonal_offsets) o.mask.diagonal_offsets.push_back(offset + k_at - q_at);
  return o;
}

bool same_bands(const AttentionOptions& o, const std::vector<KeyBand>& want, const Plan& plan, int64_t n, int64_t m) {
  const detail::MaskEval eval(o.mask, AttentionShape{plan.B, plan.H, plan.Hkv, n, m, plan.D, plan.Dv});
  for (int64_t b = 0; b < plan.B; ++b)
    for (int64_t i = 0; i < n; ++i) {
      const KeyBand got = eval.band(b, i), w = want[b * n + i];
      if (got.empty() != w.empty() || (!w.empty() && (got.lo != w.lo || got.hi != w.hi))) return false;
    }
  return true;
}

}  // namespace

AttentionOptions block_options(const Plan& plan, const RingOptions& options, const Chunk& qc, const Chunk& kc) {
  const Mask& g = options.attention.mask;
  AttentionOptions o = options.attention;
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
  // Dropout keys each weight by its global row and key, so a block drops what one call would.
  o.dropout.first_row += qc.global.begin;
  o.dropout.first_key += kc.global.begin;
  // The block's scale must be the global default 1/sqrt(D), which it is: D is the same.
  return o;
}

std::vector<BlockCall> step_calls(const Plan& plan, const RingOptions& options, int src) {
  const std::vector<Chunk>& qcs = plan.q_chunks[plan.rank];
  const std::vector<Chunk>& kcs = plan.kv_chunks[src];
  std::vector<BlockCall> calls;
  std::vector<std::vector<Block>> blocks(qcs.size());
  std::vector<bool> q_used(qcs.size()), k_used(kcs.size());
  std::pair<int, int> first_block;
  for (int qi = 0; qi < static_cast<int>(qcs.size()); ++qi)
    for (int ki = 0; ki < static_cast<int>(kcs.size()); ++ki) {
      const Chunk &qc = qcs[qi], &kc = kcs[ki];
      Block& block = blocks[qi].emplace_back();
      block.options = block_options(plan, options, qc, kc);
      block.bands = block_bands(block.options, plan, qc, kc);
      if (!has_work(block.bands)) continue;
      if (calls.empty()) first_block = {qi, ki};
      q_used[qi] = k_used[ki] = true;
      calls.push_back(
          {qi, qi + 1, ki, ki + 1, qc.offset, qc.global.size(), kc.offset, kc.global.size(), block.options});
    }
  // ALiBi depends on the distance to the diagonal and dropout on global positions, which rectangle
  // positions do not keep (a zigzag shard's chunks are not adjacent in the sequence).
  if (calls.size() < 2 || !options.attention.mask.alibi_slopes.empty() || options.attention.dropout.active())
    return calls;
  const std::pair<int, int> q = consecutive(q_used), k = consecutive(k_used);
  if (q.first == q.second || k.first == k.second) return calls;
  const std::optional<std::vector<KeyBand>> want = rectangle_bands(blocks, plan, qcs, kcs, q, k);
  if (!want) return calls;
  const int64_t n = rows_of(qcs, q.first, q.second), m = rows_of(kcs, k.first, k.second);
  const auto [fq, fk] = first_block;
  const AttentionOptions joined =
      rectangle_options(options, blocks[fq][fk], rows_of(qcs, q.first, fq), rows_of(kcs, k.first, fk));
  if (!same_bands(joined, *want, plan, n, m)) return calls;
  return {{q.first, q.second, k.first, k.second, qcs[q.first].offset, n, kcs[k.first].offset, m, joined}};
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
