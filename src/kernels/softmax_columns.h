// The forward's softmax over a block of transposed scores, one vector of query rows at a time:
// st [keys x lanes] with rows ls floats apart (forward_tile.h), so a row's max, weights and sum
// are vertical operations. Include after a family's <isa>/ops.h (Ops).
#pragma once

namespace qkv::kernels {
namespace {

// Keys per block of the fp32 forward in family Ops for ForwardParams::key_block (the CPU's
// choice, fp32_key_block): capped by the family's Ops::kKeyBlock, which sizes its buffers.
template <class Ops>
int64_t fp32_block_keys(int64_t key_block) {
  return std::min<int64_t>(key_block, Ops::kKeyBlock);
}

// max(m, st[jj·ls] for jj < nb), lane by lane, in four chains: one chain waited for max's latency
// at every key (15% of the AVX2 tile's own time, perf). The max of numbers is exact, and max()
// drops NaN scores in every chain alike, so the chains cannot change a bit of m.
template <class Ops>
typename Ops::V column_max(const float* st, int64_t ls, int64_t nb, typename Ops::V m) {
  typename Ops::V m0 = m, m1 = m, m2 = m, m3 = m;
  int64_t jj = 0;
  for (; jj + 4 <= nb; jj += 4) {
    m0 = Ops::max(Ops::load(st + jj * ls), m0);
    m1 = Ops::max(Ops::load(st + (jj + 1) * ls), m1);
    m2 = Ops::max(Ops::load(st + (jj + 2) * ls), m2);
    m3 = Ops::max(Ops::load(st + (jj + 3) * ls), m3);
  }
  for (; jj < nb; ++jj) m0 = Ops::max(Ops::load(st + jj * ls), m0);
  return Ops::max(Ops::max(m0, m1), Ops::max(m2, m3));
}

// e^x as the kernels' base-2 softmax takes it: 2^(x·log2e), x already reduced by the max.
template <class Ops>
typename Ops::V exp_e(typename Ops::V x) {
  return Ops::exp2(Ops::mul(x, Ops::set1(kLog2e)));
}

// The weight of score k·s (k = the scale, or 1, which is exact): p = e^(k·s − m), with k·s − m in
// one FMA. Subtract the max before scaling by log2(e): folding both into one FMA rounds m·log2e,
// an error of 2^8 at scores near 3e9, and the softmax then overflows or vanishes.
template <class Ops>
typename Ops::V weight(typename Ops::V s, typename Ops::V k, typename Ops::V neg_m) {
  return exp_e<Ops>(Ops::fma(s, k, neg_m));
}

// The weights of keys [0, nb) of one vector of rows, summed key by key (the order of the fp32
// loop, so l has the same bits), written as bf16 pairs of keys (Pair::round_pairs) to rows of
// `pairs` pstride apart, an odd block's last key paired with 0: P·V on pairs reads them there,
// and P never goes back to st.
template <class Ops, class Pair>
typename Ops::V weights_to_pairs(const float* st, int64_t ls, int64_t nb, typename Ops::V k, typename Ops::V neg_m,
                                 uint32_t* pairs, int64_t pstride) {
  using V = typename Ops::V;
  V sum = Ops::zero();
  int64_t jj = 0;
  for (; jj + 2 <= nb; jj += 2) {
    const V p0 = weight<Ops>(Ops::load(st + jj * ls), k, neg_m),
            p1 = weight<Ops>(Ops::load(st + (jj + 1) * ls), k, neg_m);
    sum = Ops::add(Ops::add(sum, p0), p1);
    Pair::round_pairs(p0, p1, pairs + jj / 2 * pstride);
  }
  if (jj < nb) {
    const V p0 = weight<Ops>(Ops::load(st + jj * ls), k, neg_m);
    sum = Ops::add(sum, p0);
    Pair::round_pairs(p0, Ops::zero(), pairs + jj / 2 * pstride);
  }
  return sum;
}

}  // namespace
}  // namespace qkv::kernels
