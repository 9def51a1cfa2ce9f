// Scores of large vectors summed again in double, in the forward and the backward alike, so that
// fp32 keeps FlashAttention's accuracy rule on large scores (docs/accuracy.md). Include only after
// kernel_deps.h and a family's <isa>/ops.h.
//
// The micro-kernel sums each q·k in one fp32 FMA chain over d, and the chain rounds at the size
// of its partial sums, which the vectors' size bounds, not the score: with q scaled by 50
// (FlashAttention's large-score tests) it is ~5x the error of PyTorch's small matmuls, which sum
// in 16 lanes along d. The softmax turns a score's absolute error into its weight's relative
// error, and dk, which multiplies by the large q, then missed FlashAttention's rule by up to 7x in
// about 1 case in 700; all of it came from S (with exact scores the same cases sit at 0.2-1.8x).
// So a score whose |q|·|k|·scale passes kLargeScore is summed (and scaled) again in double, where
// every product is exact, and rounded once; what that rounding left goes to the softmax too. The
// forward (from Qᵀ and rows of k) and the backward (from rows of q and k) take the norms from
// l2_norm on the same values in the same order, so they choose the same scores and refine them to
// the same bits, and P = exp(S − lse) stays consistent. Those norms are taken only where cheap fp32
// bounds of them (any order, vectorised) let a score pass: ordinary inputs pay one pass over q and
// k per task and a comparison per tile. Where the scores spread far (q·50: ~±150), most of them
// weigh nothing beside their row's largest, and the forward sums again only those near it
// (refine_near_max): the others' error cannot reach a sum of P. The backward, which knows each
// row's lse, sums again only those near it (refine_near_lse, in large_scores_screen.h); where the
// two passes sum a score in different orders, the scores that carry weight differ in the last bits
// of a double sum.
#pragma once

#include "kernels/large_scores_room.h"
#include "kernels/register_vectors.h"

namespace qkv::kernels {
namespace {

// |q|·|k|·scale past which a score is summed again (Euclidean norms). Unit-variance k and q·m give
// about m·√D (D = 64: 8 at q·1, 32 at q·4, 64 at q·8, 400 at q·50; D = 128: 11 at q·1). Over 1000
// fresh cases per scaling, the scores left in fp32 below 64 took dk to 1.10x FlashAttention's rule
// at q·4 and 1.43x at q·8 (0.5-0.9% of cases over); below 32 the worst was 0.78x at q·4 and 0.62x at
// q·2, with every score summed again 0.61x at q·8 (docs/accuracy.md).
constexpr float kLargeScore = 32.0f;

// The limit for |q|·|k|, which is what the kernels multiply.
inline float large_score_limit(float scale) { return kLargeScore / scale; }

// The limit for the gates' fp32 bounds of |q| and |k|: each is within (n + 2)·2⁻²⁴ of the exact
// norm, relative, so under this no pair of l2_norm's can pass large_score_limit.
inline float large_gate_limit(float scale, int64_t D) {
  return large_score_limit(scale) * std::max(0.0f, 1.0f - static_cast<float>(D + 16) * 0x1p-22f);
}

inline float widen(float x) { return x; }
inline float widen(bf16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16); }

// |x| of n elements `stride` apart, from exact squares summed in double in one fixed order (four
// partial sums, element d into sum d mod 4), rounded once: both passes call it on the same values,
// so they get the same bits. Contiguous elements go four at a time, a sum in each lane (element by
// element, the norms were 2% of S3's forward with q·50).
template <class T>
float l2_norm(const T* x, int64_t stride, int64_t n) {
  using Quad = RegisterVector<double, 4>::type;
  using QuadF = RegisterVector<float, 4>::type;
  Quad s{};
  int64_t d = 0;
  if (stride == 1)
    for (; d + 4 <= n; d += 4) {
      QuadF f;
      for (int i = 0; i < 4; ++i) f[i] = widen(x[d + i]);
      Quad e;
      widen_floats(f, e);
      s += e * e;
    }
  for (; d < n; ++d) {
    const double e = widen(x[d * stride]);
    s[d % 4] += e * e;
  }
  return static_cast<float>(std::sqrt((s[0] + s[1]) + (s[2] + s[3])));
}

// Eight doubles, and the eight floats they widen: GCC's generic vectors, which each family's
// source compiles to its own registers (one zmm, two ymm, four xmm), so this is written once.
using Wide = double __attribute__((vector_size(64)));
using Narrow = float __attribute__((vector_size(32)));

// u = eight contiguous elements widened to float (an out-parameter: a returned 32-byte vector
// changes the ABI where AVX is off, the scalar family's).
template <class T>
void narrow_at(const T* p, Narrow& u) {
  if constexpr (std::is_same_v<T, float>)
    std::memcpy(&u, p, sizeof u);
  else
    for (int i = 0; i < 8; ++i) u[i] = widen(p[i]);
}

// out[r] = l2_norm(xt + r, ld, n), the same bits, for r < rows of a matrix held transposed (row r
// is column r of xt, whose rows are ld apart and readable up to rows rounded up to 8): eight rows
// at a time, one in each lane, each summing in l2_norm's order.
inline void column_l2_norms(const float* xt, int64_t ld, int64_t rows, int64_t n, float* out) {
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    Wide s[4];
    for (Wide& x : s) x = Wide{};  // not `= {}`: GCC cleared that with rep stos
    auto add = [&](int64_t d, Wide& sum) {
      Narrow f;
      narrow_at(xt + d * ld + r0, f);
      Wide e;
      widen_floats(f, e);
      sum += e * e;
    };
    int64_t d = 0;
    for (; d + 4 <= n; d += 4)
      for (int i = 0; i < 4; ++i) add(d + i, s[i]);
    for (; d < n; ++d) add(d, s[d % 4]);
    const Wide total = (s[0] + s[1]) + (s[2] + s[3]);
    for (int64_t i = 0; i < 8 && r0 + i < rows; ++i) out[r0 + i] = static_cast<float>(std::sqrt(total[i]));
  }
}

// The gates' bound: max_r |x_r| in fp32, any order, over rows row_stride apart of n elements
// stride apart (contiguous rows in 16 lanes: bf16 rows one element at a time, one FMA chain,
// were 1.6% of S3's bf16 forward on Zen 3). NaN never counts.
template <class T>
float max_row_norm(const T* x, int64_t row_stride, int64_t stride, int64_t rows, int64_t n) {
  float m = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * row_stride;
    float sum = 0.0f;
    int64_t d = 0;
    if (stride == 1) {
      Narrow a{}, b{};
      for (; d + 16 <= n; d += 16) {
        Narrow u, v;
        narrow_at(row + d, u);
        narrow_at(row + d + 8, v);
        a += u * u;
        b += v * v;
      }
      const Narrow c = a + b;
      sum = ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
    }
    for (; d < n; ++d) {
      const float e = widen(row[d * stride]);
      sum += e * e;
    }
    m = std::max(m, sum);
  }
  return std::sqrt(m);
}

// out[lane] = Σ_r x[r·ld + lane]² over r < rows for vecs vectors of lanes, each lane one fused
// multiply-add chain in r order. The sums stay in registers, four vectors at a time: summed
// through memory, each step waited on the store before it, 3% of S2's forward (Zen 5).
template <class Ops, int N>
void column_squares_of(const float* x, int64_t ld, int64_t rows, float* out) {
  using V = typename Ops::V;
  V a[N];
  for (int i = 0; i < N; ++i) a[i] = Ops::zero();
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < N; ++i) {
      const V v = Ops::load(x + r * ld + i * Ops::kLanes);
      a[i] = Ops::fma(v, v, a[i]);
    }
  for (int i = 0; i < N; ++i) Ops::store(out + i * Ops::kLanes, a[i]);
}

template <class Ops>
void column_squares(const float* x, int64_t ld, int64_t rows, int64_t vecs, float* out) {
  constexpr int L = Ops::kLanes;
  for (int64_t g = 0; g < vecs; g += 4) {
    const int64_t n = std::min<int64_t>(4, vecs - g);
    if (n == 4)
      column_squares_of<Ops, 4>(x + g * L, ld, rows, out + g * L);
    else if (n == 3)
      column_squares_of<Ops, 3>(x + g * L, ld, rows, out + g * L);
    else if (n == 2)
      column_squares_of<Ops, 2>(x + g * L, ld, rows, out + g * L);
    else
      column_squares_of<Ops, 1>(x + g * L, ld, rows, out + g * L);
  }
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

// How many of a block's scores pass large_score_limit (rows of norms size_a against columns of
// norms size_b): none, some, or every one, when the fp32 product is not worth computing. The
// forward and the backward decide with this, on the same norms.
enum class Refine { none, some, every };
inline Refine refine_extent(const float* size_a, int64_t rows, const float* size_b, int64_t cols, float limit) {
  if (smallest(size_a, rows) * smallest(size_b, cols) > limit) return Refine::every;
  if (largest(size_a, rows) * largest(size_b, cols) > limit) return Refine::some;
  return Refine::none;
}

constexpr float kLowPartLimit = 65536.0f;  // refine_scores keeps low parts of scores below this

// Doubles in one of a family's vector registers, as a GCC vector type. Wide itself is 64 bytes:
// where that is wider than a register, GCC lowered its arithmetic element by element through the
// stack, and S3 with q·50 ran 15x slower than with ordinary scores on AVX2 (Zen 3, measured). The
// sums run in this type instead.
template <class Ops>
using DoubleReg = typename RegisterVector<double, kDoubleLanes<Ops>>::type;

// Registers of doubles one pass of wide_dots sums per row: as many as kRefineRows rows of them
// keep in the registers a family's micro-tile keeps its accumulators in (Ops::kRows x Ops::kVecs).
template <class Ops>
constexpr int regs_per_pass() {
  return std::clamp(Ops::kRows * Ops::kVecs / kRefineRows, 1,
                    static_cast<int>(kWideCols * sizeof(double) / sizeof(DoubleReg<Ops>)));
}

// acc[r][x] = Σ_d a[r·kdim + d] · bt[d·kWideCols + x] for d < kdim and the NV registers of columns
// from x0, in double in the order of d. Both are already widened (refine_scores): converting bt at
// every use put a vcvtps2pd beside every two FMAs, and a row's float at every use a conversion and
// a register broadcast beside every four, on the FMAs' ports (a broadcast from memory is a load).
// R rows share each load of bt; NV is a template parameter so that the accumulators stay in
// registers. bt and acc are aligned to a register, and read and written as registers: a memcpy went
// through the stack in 16-byte halves (a stalled store forward at every load), and one of a sum
// kept every sum in memory.
template <class Ops, int R, int NV>
void wide_dots(const double* a, const double* bt, int64_t kdim, int64_t x0, double (&acc)[R][kWideCols]) {
  using D = DoubleReg<Ops>;
  D sum[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) sum[r][v] = D{};  // not `= {}`: GCC cleared that with rep stos
  for (int64_t d = 0; d < kdim; ++d) {
    const D* b = reinterpret_cast<const D*>(bt + d * kWideCols + x0);
    for (int r = 0; r < R; ++r) {
      const double ar = a[r * kdim + d];
      for (int v = 0; v < NV; ++v) sum[r][v] += ar * b[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) reinterpret_cast<D*>(&acc[r][x0])[v] = sum[r][v];
}

// The same for columns [0, n), n <= kWideCols known only at run time, in passes of at most
// sizeof...(Counts) registers (one instance per count); columns up to n rounded up to a register.
template <class Ops, int R, std::size_t... Counts>
void wide_dots(const double* a, const double* bt, int64_t kdim, int64_t n, double (&acc)[R][kWideCols],
               std::index_sequence<Counts...>) {
  using Fn = void (*)(const double*, const double*, int64_t, int64_t, double(&)[R][kWideCols]);
  static constexpr Fn kByCount[] = {&wide_dots<Ops, R, static_cast<int>(Counts) + 1>...};
  constexpr int64_t kD = sizeof(DoubleReg<Ops>) / sizeof(double), kPass = sizeof...(Counts);
  const int64_t regs = (n + kD - 1) / kD;
  for (int64_t v0 = 0; v0 < regs; v0 += kPass) kByCount[std::min(kPass, regs - v0) - 1](a, bt, kdim, v0 * kD, acc);
}

template <class Ops, int R>
void wide_dots(const double* a, const double* bt, int64_t kdim, int64_t n, double (&acc)[R][kWideCols]) {
  wide_dots<Ops, R>(a, bt, kdim, n, acc, std::make_index_sequence<regs_per_pass<Ops>()>{});
}

// Row r < rows of the scores s (at s + r·lds; columns x < n <= 64): where size_a[r] · sizes[x] >
// limit (Euclidean norms; sizes holds n rounded up to 8 entries, 0 past n), the scaled score
// becomes scale · Σ_d a_r[d·a_stride] · bt[d·ldb + x] with a_r = a + r·a_row, summed and scaled in
// double in the order of d and rounded to float once (one rounding of a score of ~100 is what
// remains of the error; a second one, of q·k before scaling, added ~15% to the median error).
// The forward passes rows of k against qᵀ, the backward rows of q against kᵀ: the products are
// exact, so both get the same bits. With `every` (the caller found that all
// the scores pass), every column of every row is written and s need not hold anything before.
// Rows of bt and s are read in whole groups of 8 columns: n rounded up to 8 must not pass ldb or
// lds. wide: room for refine_room(kdim) doubles (64-byte aligned), where bt is widened once and
// each pass's rows of a.
// s_lo (optional, laid out as s, rows x lds): where a score is written, what its rounding left,
// score − s rounded to float (0 where s is not finite or past kLowPartLimit); 0 elsewhere. The softmax adds it
// to s − max (exact near the max), so the weights see the score to ~2⁻⁴⁸ rather than to one
// rounding of a score of ~100 (docs/accuracy.md).
template <class Ops>
void refine_scores(const float* a, int64_t a_row, int64_t a_stride, const float* size_a, const float* bt, int64_t ldb,
                   const float* sizes, int64_t kdim, float scale, float* s, float* s_lo, int64_t lds, int64_t rows,
                   int64_t n, float limit, bool every, double* wide) {
  const float nmax = largest(sizes, n);
  const int64_t nv = (n + 7) / 8;
  const Narrow limits = Narrow{} + limit;
  const Wide scales = Wide{} + static_cast<double>(scale);  // once: built per row, it went through the stack
  if (s_lo && !every) std::fill(s_lo, s_lo + rows * lds, 0.0f);
  // Row r's chosen scores from acc, 8 at a time (the tail past n compares zero norms).
  auto write = [&](int64_t r, const double* acc) {
    for (int64_t v = 0; v < nv; ++v) {
      Narrow nx, old;
      Wide w;
      std::memcpy(&nx, sizes + 8 * v, sizeof nx);
      std::memcpy(&w, acc + 8 * v, sizeof w);
      w *= scales;
      const Narrow fresh = __builtin_convertvector(w, Narrow);
      // convertvector both ways: GCC 12 folded the element-wise double(float(w)) back into w in
      // the AVX-512 family, and the residual came out as w − w. Not past 2^16: there the part
      // would outweigh s − max's own rounding and push 2^x past the float range at scores of 1e30
      // (Limits tests); inf − inf would be NaN.
      const Narrow lo = ((fresh - fresh == 0) & (fresh < kLowPartLimit) & (fresh > -kLowPartLimit))
                            ? __builtin_convertvector(w - __builtin_convertvector(fresh, Wide), Narrow)
                            : Narrow{};
      float* out = s + r * lds + 8 * v;
      float* out_lo = s_lo ? s_lo + r * lds + 8 * v : nullptr;
      if (every) {
        std::memcpy(out, &fresh, sizeof fresh);
        if (out_lo) std::memcpy(out_lo, &lo, sizeof lo);
        continue;
      }
      std::memcpy(&old, out, sizeof old);
      const auto pass = size_a[r] * nx > limits;  // refined(), 8 at a time
      const Narrow chosen = pass ? fresh : old;
      std::memcpy(out, &chosen, sizeof chosen);
      if (!out_lo) continue;
      const Narrow chosen_lo = pass ? lo : Narrow{};
      std::memcpy(out_lo, &chosen_lo, sizeof chosen_lo);
    }
  };
  bool widened = false;
  auto widen_bt = [&] {
    for (int64_t d = 0; d < kdim; ++d)
      for (int64_t x = 0; x < 8 * nv; ++x) wide[d * kWideCols + x] = bt[d * ldb + x];
    widened = true;
  };
  // Rows go in groups of kRefineRows, which share each load of the widened bt.
  int64_t group[kRefineRows];
  int count = 0;
  auto flush = [&]<int R>(std::integral_constant<int, R>) {
    double* const rows_a = wide + kWideCols * kdim;
    for (int i = 0; i < R; ++i)
      for (int64_t d = 0; d < kdim; ++d) rows_a[i * kdim + d] = a[group[i] * a_row + d * a_stride];
    alignas(64) double acc[R][kWideCols];
    wide_dots<Ops, R>(rows_a, wide, kdim, 8 * nv, acc);
    for (int i = 0; i < R; ++i) write(group[i], acc[i]);
  };
  for (int64_t r = 0; r < rows; ++r) {
    if (!every && !(size_a[r] * nmax > limit)) continue;
    if (!widened) widen_bt();
    group[count++] = r;
    if (count == kRefineRows) flush(std::integral_constant<int, kRefineRows>{}), count = 0;
  }
  if (count == 2) flush(std::integral_constant<int, 2>{});
  if (count == 1) flush(std::integral_constant<int, 1>{});
}

// Whether refine_scores sums the score of norms size_a, size_b again: its own test, taken in
// float, so the forward (k against q) and the backward (q against k) decide alike for each score.
inline bool refined(float size_a, float size_b, float limit) { return size_a * size_b > limit; }

// A logit in double as a float and what its rounding left: the low part only where |hi| is under
// kLowPartLimit (as refine_scores; the integer compare of |hi|'s bits also leaves out inf and NaN,
// and lets softcap_refined_run's loop vectorize).
inline void split_logit(double logit, float& hi, float& lo) {
  constexpr int32_t kLowPartBits = std::bit_cast<int32_t>(kLowPartLimit);
  hi = static_cast<float>(logit);
  const int32_t keep = -static_cast<int32_t>((std::bit_cast<int32_t>(hi) & 0x7fffffff) < kLowPartBits);
  lo = std::bit_cast<float>(std::bit_cast<int32_t>(static_cast<float>(logit - static_cast<double>(hi))) & keep);
}

// A refined score s + s_lo through the elementwise terms (MaskEval::add_terms: bias, ALiBi,
// keep-mask, after softcap) in double, split again into a float and what its rounding left (0
// where the logit is not finite or past kLowPartLimit, as refine_scores); softcap by
// softcap_wide, to double's accuracy, and its derivative to *slope when asked. The fp32 adjust
// rounded softcap's cap·tanh(x/cap) at ~32 once more, an error of up to 1.9e-6 in the logit and
// so in P's relative error: with q scaled by 50 that took dk to 2x FlashAttention's rule
// (docs/accuracy.md). Both passes call it on the same refined scores, so P = exp(S − lse)
// stays consistent.
template <class Mask>
void adjust_refined(const Mask& mask, float& s, float& s_lo, int64_t b, int64_t h, int64_t i, int64_t j,
                    float* slope = nullptr) {
  double logit = static_cast<double>(s) + static_cast<double>(s_lo);
  if (const double cap = mask.mask().softcap; cap > 0) {
    const detail::SoftcapWide capped = detail::softcap_wide(logit, cap);
    logit = capped.value;
    if (slope != nullptr) *slope = static_cast<float>(capped.slope);
  }
  split_logit(mask.add_terms(logit, b, h, i, j), s, s_lo);
}

// Softcap alone (no other elementwise term) over a run of n scores of a tile that has refined ones:
// score j is refined when refined(sizes[j], size, limit), as the scores' own sum decided. Those
// take adjust_refined's path (softcap_wide on s + s_lo, split again); the others softcap_score,
// with s_lo 0 as refine_scores left it. Both are computed for every score and one is kept, so the
// loop has no branch for the compiler to stop at; the bits are the per-score paths'. slope, when
// not null, gets softcap's derivative at each.
template <bool kSlope>
void softcap_refined_run(float* __restrict s, float* __restrict s_lo, float* __restrict slope,
                         const float* __restrict sizes, float size, float limit, int64_t n, float cap) {
  const double two_over_cap = 2.0 / cap;
  for (int64_t j = 0; j < n; ++j) {
    const float x = s[j];
    const double ef = detail::softcap_e(x, two_over_cap);
    const detail::SoftcapWide w = detail::softcap_wide(static_cast<double>(x) + static_cast<double>(s_lo[j]), cap);
    float hi, lo;
    split_logit(w.value, hi, lo);
    const int32_t wide = -static_cast<int32_t>(refined(sizes[j], size, limit));
    auto pick = [wide](float a, float b) {
      return std::bit_cast<float>((std::bit_cast<int32_t>(a) & wide) | (std::bit_cast<int32_t>(b) & ~wide));
    };
    s[j] = pick(hi, detail::softcap_value(x, ef, cap));
    s_lo[j] = pick(lo, 0.0f);
    if constexpr (kSlope) slope[j] = pick(static_cast<float>(w.slope), detail::softcap_derivative(ef));
  }
}

inline void softcap_refined_run(float* s, float* s_lo, float* slope, const float* sizes, float size, float limit,
                                int64_t n, float cap) {
  // Two loops: a test of slope inside one stopped GCC from vectorizing it.
  if (slope != nullptr)
    softcap_refined_run<true>(s, s_lo, slope, sizes, size, limit, n, cap);
  else
    softcap_refined_run<false>(s, s_lo, slope, sizes, size, limit, n, cap);
}

}  // namespace
}  // namespace qkv::kernels
