// Scores of large vectors summed again in double, in the forward and the backward alike (issue
// 16, item 0). Include only after kernel_deps.h and a family's simd_*.h.
//
// The micro-kernel sums each q·k in one fp32 FMA chain over d, and the chain rounds at the size
// of its partial sums, which the vectors' size bounds, not the score: with q scaled by 50
// (FlashAttention's large-score tests) it is ~5x the error of PyTorch's small matmuls, which sum
// in 16 lanes along d. The softmax turns a score's absolute error into its weight's relative
// error, and dk, which multiplies by the large q, then missed FlashAttention's rule by up to 7x in
// about 1 case in 700; all of it came from S (with exact scores the same cases sit at 0.2-1.8x).
// So a score whose bound D·max|q_d|·max|k_d|·scale passes kLargeScore is summed again in double,
// where every product is exact, and rounded once. The bound uses max-norms because a maximum is
// exact in any order: the forward (from rows of k and Qᵀ) and the backward (from rows of q and
// Kᵀ) get the same bits, choose the same scores and refine them to the same bits, and P =
// exp(S − lse) stays consistent. Ordinary inputs pay one max per element of q and k per task and
// one comparison per key block.
#pragma once

namespace qkv::kernels {
namespace {

// D·max|q_d|·max|k_d|·scale past which a score is summed again. Unit-variance inputs give ~7·√D
// (50 at D = 64, 80 at 128; the largest pair of a 239 x 239 case at D = 128 about 270), q scaled
// by 50 some 2500-13000. Without the second sum, q·4 (bounds up to 1070) kept dk within 1.5x
// FlashAttention's rule and q·8 reached 2.3x; with it at 256, q·8 stays within 0.84x and q·50
// within 1.32x; at 512, q·8 reached 1.52x (TESTING.md, "Round 9").
constexpr float kLargeScore = 256.0f;

// The bound for max|q_d|·max|k_d|, which is what the kernels multiply.
inline float large_score_limit(float scale, int64_t D) { return kLargeScore / (scale * static_cast<float>(D)); }

// max(|v|, m) lane by lane; max() keeps its second operand over NaN, so NaN never counts.
template <class Ops>
typename Ops::V abs_max_fold(typename Ops::V v, typename Ops::V m) {
  return Ops::max(Ops::max(v, Ops::sub(Ops::zero(), v)), m);
}

// max |x[r·row_stride + d·stride]| over r < rows, d < n, and 0: exact in any order. One vector of
// maxima serves the whole matrix, with one horizontal step at the end (a step per row cost S2's
// forward 3%). NaN never counts.
template <class Ops>
float abs_max(const float* x, int64_t row_stride, int64_t stride, int64_t rows, int64_t n) {
  using V = typename Ops::V;
  constexpr int L = Ops::kLanes;
  const V zero = Ops::zero();
  auto fold = [](const float* p, V m) { return abs_max_fold<Ops>(Ops::load(p), m); };
  V m0 = zero, m1 = zero, m2 = zero, m3 = zero;  // four chains: one waited on max's latency
  float m = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * row_stride;
    int64_t d = 0;
    if (stride == 1) {
      for (; d + 4 * L <= n; d += 4 * L)
        m0 = fold(row + d, m0), m1 = fold(row + d + L, m1), m2 = fold(row + d + 2 * L, m2),
        m3 = fold(row + d + 3 * L, m3);
      for (; d + L <= n; d += L) m0 = fold(row + d, m0);
    }
    for (; d < n; ++d) m = std::max(m, std::fabs(row[d * stride]));
  }
  alignas(64) float lanes[L];
  Ops::store(lanes, Ops::max(Ops::max(m0, m1), Ops::max(m2, m3)));
  for (float lane : lanes) m = std::max(m, lane);
  return m;
}

// The largest of x[0, n) and 0; NaN never counts.
inline float largest(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// The smallest of x[0, n), NaN if one is (so that "all pass" fails); +inf for n = 0.
inline float smallest(const float* x, int64_t n) {
  float m = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return x[i];
    m = std::min(m, x[i]);
  }
  return m;
}

// Eight doubles, and the eight floats they widen: GCC's generic vectors, which each family's
// source compiles to its own registers (one zmm, two ymm, four xmm), so this is written once.
using Wide = double __attribute__((vector_size(64)));
using Narrow = float __attribute__((vector_size(32)));
constexpr int64_t kWideCols = 64;  // columns of one pass: 8 Wide per row

// acc[r][v] = Σ_d a_r[d·a_stride] · bt[d·ldb + 8v .. 8v + 8) for d < kdim, v < NV, in double in
// the order of d. R rows share each widened load of bt; NV is a template parameter so that the
// accumulators stay in registers.
template <int R, int NV>
void wide_dots(const float* const (&a)[R], int64_t a_stride, const float* bt, int64_t ldb, int64_t kdim,
               Wide (&acc)[R][kWideCols / 8]) {
  Wide sum[R][NV] = {};
  for (int64_t d = 0; d < kdim; ++d) {
    Wide b[NV];
    for (int v = 0; v < NV; ++v) {
      Narrow f;
      std::memcpy(&f, bt + d * ldb + 8 * v, sizeof f);
      b[v] = Wide{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]};  // one vcvtps2pd (GCC 12 splits convertvector)
    }
    for (int r = 0; r < R; ++r) {
      const double ar = a[r][d * a_stride];
      for (int v = 0; v < NV; ++v) sum[r][v] += ar * b[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = sum[r][v];
}

// The same for a count nv in [1, 8] known only at run time: one instance per count.
template <int R, std::size_t... Counts>
void wide_dots(const float* const (&a)[R], int64_t a_stride, const float* bt, int64_t ldb, int64_t kdim, int64_t nv,
               Wide (&acc)[R][kWideCols / 8], std::index_sequence<Counts...>) {
  using Fn = void (*)(const float* const(&)[R], int64_t, const float*, int64_t, int64_t, Wide(&)[R][kWideCols / 8]);
  static constexpr Fn kByCount[] = {&wide_dots<R, static_cast<int>(Counts) + 1>...};
  kByCount[nv - 1](a, a_stride, bt, ldb, kdim, acc);
}

template <int R>
void wide_dots(const float* const (&a)[R], int64_t a_stride, const float* bt, int64_t ldb, int64_t kdim, int64_t nv,
               Wide (&acc)[R][kWideCols / 8]) {
  wide_dots<R>(a, a_stride, bt, ldb, kdim, nv, acc, std::make_index_sequence<kWideCols / 8>{});
}

// Row r < rows of the scores s (at s + r·lds; columns x < n <= 64): where size_a[r] · sizes[x] >
// limit (max-norms; sizes holds n rounded up to 8 entries, 0 past n), the score becomes
// Σ_d a_r[d·a_stride] · bt[d·ldb + x] with a_r = a + r·a_row, summed in double in the order of d
// and rounded to float. The forward passes rows of k against qᵀ, the backward rows of q against
// kᵀ: the products are exact, so both get the same bits. With `every` (the caller found that all
// the scores pass), every column of every row is written and s need not hold anything before.
// Rows of bt and s are read in whole groups of 8 columns: n rounded up to 8 must not pass ldb or
// lds.
inline void refine_scores(const float* a, int64_t a_row, int64_t a_stride, const float* size_a, const float* bt,
                          int64_t ldb, const float* sizes, int64_t kdim, float* s, int64_t lds, int64_t rows, int64_t n,
                          float limit, bool every) {
  const float nmax = largest(sizes, n);
  const int64_t nv = (n + 7) / 8;
  const Narrow limits = Narrow{} + limit;
  // Row r's chosen scores from acc, 8 at a time (the tail past n compares zero norms).
  auto write = [&](int64_t r, const Wide* acc) {
    for (int64_t v = 0; v < nv; ++v) {
      Narrow nx, old;
      std::memcpy(&nx, sizes + 8 * v, sizeof nx);
      const Wide& w = acc[v];
      const Narrow fresh = {static_cast<float>(w[0]), static_cast<float>(w[1]), static_cast<float>(w[2]),
                            static_cast<float>(w[3]), static_cast<float>(w[4]), static_cast<float>(w[5]),
                            static_cast<float>(w[6]), static_cast<float>(w[7])};
      if (every) {
        std::memcpy(s + r * lds + 8 * v, &fresh, sizeof fresh);
        continue;
      }
      std::memcpy(&old, s + r * lds + 8 * v, sizeof old);
      const Narrow chosen = size_a[r] * nx > limits ? fresh : old;
      std::memcpy(s + r * lds + 8 * v, &chosen, sizeof chosen);
    }
  };
  int64_t pending = -1;  // rows go in pairs: the pair shares the loads of bt
  for (int64_t r = 0; r < rows; ++r) {
    if (!every && !(size_a[r] * nmax > limit)) continue;
    if (pending < 0) {
      pending = r;
      continue;
    }
    Wide acc[2][kWideCols / 8];
    wide_dots<2>({a + pending * a_row, a + r * a_row}, a_stride, bt, ldb, kdim, nv, acc);
    write(pending, acc[0]);
    write(r, acc[1]);
    pending = -1;
  }
  if (pending >= 0) {
    Wide acc[1][kWideCols / 8];
    wide_dots<1>({a + pending * a_row}, a_stride, bt, ldb, kdim, nv, acc);
    write(pending, acc[0]);
  }
}

}  // namespace
}  // namespace qkv::kernels
