// Register-blocked micro-kernel shared by every block product of the attention kernels:
//   C[R x NV*L] = alpha ⊙ C + A[R x K] · B[K x NV*L]   (alpha per row; no alpha: C = A·B)
// A is read one element at a time (broadcast), through a row stride and a k stride, so it can be
// any strided matrix (rows of K, or a transposed P); B is read in vectors of L = Ops::kLanes
// contiguous elements per k step, rows ldb apart. The R x NV fp32 accumulators stay in registers.
// Dot says what an element is: FloatDot multiplies floats with FMA; the bf16 policy (avx512/ops.h)
// makes each element a pair of bf16 and each step a vdpbf16ps (two products per lane).
// Include after a family's <isa>/ops.h.
#pragma once

namespace qkv::kernels {

template <class Ops>
struct FloatDot {
  using V = typename Ops::V;
  using AT = float;
  using BT = float;
  static V bcast(const float* a) { return Ops::set1(*a); }
  static V load(const float* b) { return Ops::load(b); }
  static V madd(V a, V b, V acc) { return Ops::fma(a, b, acc); }
};

template <class AT, class BT>
struct GemmArgs {
  int64_t kdim = 0;  // K
  const AT* a = nullptr;
  int64_t a_row = 0;  // element stride between rows of A
  int64_t a_k = 0;    // element stride along K in A
  const BT* b = nullptr;
  int64_t ldb = 0;  // element stride between rows of B
  float* c = nullptr;
  int64_t ldc = 0;
  const float* alpha = nullptr;  // per-row scale of the old C; nullptr: C is overwritten
  bool add = false;              // with alpha null: C += A·B (gemm_blocked's later K chunks)
  // Non-null: col_max[c] = max(col_max[c], C[r][c] over the rows written), for the columns
  // written, as C is stored. The forward's softmax then needs no pass over the scores to find
  // each query's max. NaN in C is dropped, as Ops::max(c, m) drops it.
  float* col_max = nullptr;
  // Whether gemm_blocked may split K into chunks (k_chunk): the CPU's measured choice, which the
  // micro-kernel's test overrides to run both ways on every CPU.
  bool split_k = cpu_features().split_k;
};

// How a micro-tile's accumulators start: 0, or C as it is (a later K chunk). With alpha they
// start from 0 as well and C = alpha ⊙ C + A·B is formed at the store, so the K products are
// summed on their own before they meet C: a sum that many calls add to (the backward's dq over
// every key tile) then rounds once per call at C's size, not once per product, whose error grew
// with the number of calls. Each start has its own copy of the loop (a template parameter): with
// one loop after a runtime branch, GCC built the accumulators on the stack and reloaded them (12
// stores and loads per AVX2 micro-tile of K = 64).
enum class Start { zero, scaled, load };

// KFixed > 0 fixes K at compile time (head dims 64 and 128), so the k loop can be unrolled.
template <class Ops, class Dot, int R, int NV, int KFixed, Start From>
void gemm_micro_from(const GemmArgs<typename Dot::AT, typename Dot::BT>& g) {
  using V = typename Ops::V;
  constexpr int L = Ops::kLanes;
  // c and ldc as locals: the vector stores may alias g, whose fields were reloaded at every store.
  float* const c = g.c;
  const int64_t ldc = g.ldc;
  V acc[R][NV];
  for (int r = 0; r < R; ++r) {
    if constexpr (From == Start::load) {
      for (int v = 0; v < NV; ++v) acc[r][v] = Ops::load(c + r * ldc + v * L);
    } else {
      for (int v = 0; v < NV; ++v) acc[r][v] = Ops::zero();
    }
  }
  int64_t offset[R];
  for (int r = 0; r < R; ++r) offset[r] = r * g.a_row;
  const int64_t kdim = KFixed > 0 ? KFixed : g.kdim;
  const typename Dot::AT* a = g.a;
  const typename Dot::BT* b = g.b;
  for (int64_t k = 0; k < kdim; ++k) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = Dot::load(b + v * L);
    for (int r = 0; r < R; ++r) {
      const V ar = Dot::bcast(a + offset[r]);
      for (int v = 0; v < NV; ++v) acc[r][v] = Dot::madd(ar, bv[v], acc[r][v]);
    }
    a += g.a_k;
    b += g.ldb;
  }
  if constexpr (From == Start::scaled)
    for (int r = 0; r < R; ++r) {
      const V s = Ops::set1(g.alpha[r]);
      for (int v = 0; v < NV; ++v) acc[r][v] = Ops::fma(s, Ops::load(c + r * ldc + v * L), acc[r][v]);
    }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) Ops::store(c + r * ldc + v * L, acc[r][v]);
  if (g.col_max != nullptr)
    for (int v = 0; v < NV; ++v) {
      V m = Ops::load(g.col_max + v * L);
      for (int r = 0; r < R; ++r) m = Ops::max(acc[r][v], m);
      Ops::store(g.col_max + v * L, m);
    }
}

template <class Ops, class Dot, int R, int NV, int KFixed>
void gemm_micro(const GemmArgs<typename Dot::AT, typename Dot::BT>& g) {
  if (g.alpha != nullptr)
    gemm_micro_from<Ops, Dot, R, NV, KFixed, Start::scaled>(g);
  else if (g.add)
    gemm_micro_from<Ops, Dot, R, NV, KFixed, Start::load>(g);
  else
    gemm_micro_from<Ops, Dot, R, NV, KFixed, Start::zero>(g);
}

// Runtime choice among the instantiations for 1..Ops::kRows rows and 1..Ops::kVecs vectors.
template <class Ops, class Dot, int KFixed = 0>
class GemmTable {
 public:
  using Fn = void (*)(const GemmArgs<typename Dot::AT, typename Dot::BT>&);
  static Fn get(int rows, int vecs) { return table()[rows - 1][vecs - 1]; }

 private:
  static constexpr int kR = Ops::kRows, kNV = Ops::kVecs;
  using Table = std::array<std::array<Fn, kNV>, kR>;
  template <int R, int... NV>
  static constexpr std::array<Fn, kNV> row(std::integer_sequence<int, NV...>) {
    return {&gemm_micro<Ops, Dot, R, NV + 1, KFixed>...};
  }
  template <int... R>
  static constexpr Table make(std::integer_sequence<int, R...>) {
    return {row<R + 1>(std::make_integer_sequence<int, kNV>{})...};
  }
  static const Table& table() {
    static constexpr Table t = make(std::make_integer_sequence<int, kR>{});
    return t;
  }
};

// The row stride for a matrix of n columns that the micro-kernel reads down a column, one row per
// k step (A with a_row = 1: the forward's P, transposed): a whole number of cache lines, and an odd one.
// At 64 floats (four lines) the rows of such a walk fell into a quarter of L1's sets, beside B's
// rows in all of them, and evicted one another: one more line per row took P·V from ~80% to
// ~95% of the FMA peak (Skylake-SP, measured).
constexpr int64_t column_read_stride(int64_t n) {
  const int64_t lines = (n + 15) / 16;
  return (lines | 1) * 16;
}

// Whether rows starting at p, row_bytes apart, all start on a boundary of vector_bytes (the
// family's vector, a divisor of a 64-byte cache line): then no vector load of such B rows spans
// two cache lines.
inline bool vectors_aligned(const void* p, int64_t row_bytes, int64_t vector_bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(vector_bytes) == 0 &&
         row_bytes % vector_bytes == 0;
}

// The B rows one K chunk of gemm_blocked may span: with more, B fell out of L1 (32 KB on many
// cores) between the strips of rows that reuse it. A block product of K = 128 over one panel of B
// (P·V over a key block of 128 at Dv = 64, or the scores at head dim 128) ran at ~80% of the FMA
// peak in one pass and ~95% in two chunks of 64 (Skylake-SP, measured). Over two
// panels (Dv = 128) chunks measured slower than one pass (84 against 103-113 GFLOP/s), so only one
// panel is chunked. On Zen 5 (48 KB L1) one pass was faster at every size measured, 32-64 KB of B
// rows included, so there GemmArgs::split_k is off (CpuFeatures::split_k).
constexpr int64_t kChunkBytes = 16 * 1024;

// The K chunk of gemm_blocked for B rows of `panels` panels of `width` elements of `bytes` each:
// 64 when K > 64 and one panel's rows exceed kChunkBytes, else K itself (a micro-tile of fewer k
// steps pays its start and stores more often: chunks of 32 measured no better than one pass).
inline int64_t k_chunk(int64_t kdim, int64_t panels, int64_t width, int64_t bytes) {
  return panels == 1 && kdim > 64 && kdim * width * bytes > kChunkBytes ? 64 : kdim;
}

// The K chunk gemm_blocked takes for g (without alpha) over `vecs` vectors of columns: K itself
// when it runs K in one pass.
template <class Ops, class Dot = FloatDot<Ops>>
int64_t gemm_chunk(const GemmArgs<typename Dot::AT, typename Dot::BT>& g, int64_t vecs) {
  const int64_t panels = (vecs + Ops::kVecs - 1) / Ops::kVecs;
  return std::max<int64_t>(1,
                           g.split_k ? k_chunk(g.kdim, panels, vecs * Ops::kLanes, sizeof(typename Dot::BT)) : g.kdim);
}

// C = alpha ⊙ C + A·B for any rows x (vecs * L) by tiling with the micro-kernel, K in chunks
// (k_chunk, where g.split_k) each of which runs over every strip of rows before the next starts.
// A later chunk carries on from C as the last one stored it, so the sums and their order, and so
// every bit, are those of one pass. With alpha, K runs in one pass: alpha ⊙ C joins the sum at its
// end (Start), which a later chunk would then carry on from. The full-size micro-tiles use a K-specialized
// instantiation for K = 32, 64, 128 (head dims 64 and 128, in pairs for bf16, and full key blocks).
template <class Ops, class Dot = FloatDot<Ops>>
void gemm_blocked(const GemmArgs<typename Dot::AT, typename Dot::BT>& g, int64_t rows, int64_t vecs) {
  constexpr int L = Ops::kLanes, kR = Ops::kRows, kNV = Ops::kVecs;
  const int64_t chunk = g.alpha == nullptr ? gemm_chunk<Ops, Dot>(g, vecs) : std::max<int64_t>(1, g.kdim);
  int64_t k0 = 0;
  do {  // once at K = 0, which still writes C (0 or alpha ⊙ C)
    const int64_t kc = std::min(chunk, g.kdim - k0);
    auto full = GemmTable<Ops, Dot>::get(kR, kNV);
    if (kc == 32) full = GemmTable<Ops, Dot, 32>::get(kR, kNV);
    if (kc == 64) full = GemmTable<Ops, Dot, 64>::get(kR, kNV);
    if (kc == 128) full = GemmTable<Ops, Dot, 128>::get(kR, kNV);
    for (int64_t r0 = 0; r0 < rows; r0 += kR) {
      const int r = static_cast<int>(std::min<int64_t>(kR, rows - r0));
      for (int64_t v0 = 0; v0 < vecs; v0 += kNV) {
        const int nv = static_cast<int>(std::min<int64_t>(kNV, vecs - v0));
        auto t = g;
        t.kdim = kc;
        t.a = g.a + r0 * g.a_row + k0 * g.a_k;
        t.b = g.b + k0 * g.ldb + v0 * L;
        t.c = g.c + r0 * g.ldc + v0 * L;
        t.alpha = g.alpha != nullptr && k0 == 0 ? g.alpha + r0 : nullptr;
        t.add = k0 > 0 || g.add;
        t.col_max = g.col_max != nullptr && k0 + kc == g.kdim ? g.col_max + v0 * L : nullptr;
        (r == kR && nv == kNV ? full : GemmTable<Ops, Dot>::get(r, nv))(t);
      }
    }
    k0 += chunk;
  } while (k0 < g.kdim);
}

}  // namespace qkv::kernels
