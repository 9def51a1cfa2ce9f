// Register-blocked micro-kernel shared by every block product of the attention kernels:
//   C[R x NV*L] = alpha ⊙ C + A[R x K] · B[K x NV*L]   (alpha per row; no alpha: C = A·B)
// A is read one element at a time (broadcast), through a row stride and a k stride, so it can be
// any strided matrix (rows of K, or a transposed P); B is read in vectors of L = Ops::kLanes
// contiguous elements per k step, rows ldb apart. The R x NV fp32 accumulators stay in registers.
// Dot says what an element is: FloatDot multiplies floats with FMA; the bf16 policy (simd_avx512.h)
// makes each element a pair of bf16 and each step a vdpbf16ps (two products per lane).
// Include only after kernel_deps.h and a family's simd_*.h (see kernel_deps.h).
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
};

// KFixed > 0 fixes K at compile time (head dims 64 and 128), so the k loop can be unrolled.
// Scaled: C starts as alpha ⊙ C (else as 0), a template parameter so that each start has its own
// copy of the loop: with one loop after a runtime branch, GCC built the accumulators on the stack
// and reloaded them (12 stores and loads per AVX2 micro-tile of K = 64).
template <class Ops, class Dot, int R, int NV, int KFixed, bool Scaled>
void gemm_micro_from(const GemmArgs<typename Dot::AT, typename Dot::BT>& g) {
  using V = typename Ops::V;
  constexpr int L = Ops::kLanes;
  // c and ldc as locals: the vector stores may alias g, whose fields were reloaded at every store.
  float* const c = g.c;
  const int64_t ldc = g.ldc;
  V acc[R][NV];
  for (int r = 0; r < R; ++r) {
    if constexpr (Scaled) {
      const V s = Ops::set1(g.alpha[r]);
      for (int v = 0; v < NV; ++v) acc[r][v] = Ops::mul(Ops::load(c + r * ldc + v * L), s);
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
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) Ops::store(c + r * ldc + v * L, acc[r][v]);
}

template <class Ops, class Dot, int R, int NV, int KFixed>
void gemm_micro(const GemmArgs<typename Dot::AT, typename Dot::BT>& g) {
  if (g.alpha != nullptr)
    gemm_micro_from<Ops, Dot, R, NV, KFixed, true>(g);
  else
    gemm_micro_from<Ops, Dot, R, NV, KFixed, false>(g);
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

// C = alpha ⊙ C + A·B for any rows x (vecs * L) by tiling with the micro-kernel. The full-size
// micro-tiles use a K-specialized instantiation for K = 32, 64, 128 (head dims 64 and 128, in
// pairs for bf16, and full key blocks).
template <class Ops, class Dot = FloatDot<Ops>>
void gemm_blocked(const GemmArgs<typename Dot::AT, typename Dot::BT>& g, int64_t rows, int64_t vecs) {
  constexpr int L = Ops::kLanes, kR = Ops::kRows, kNV = Ops::kVecs;
  auto full = GemmTable<Ops, Dot>::get(kR, kNV);
  if (g.kdim == 32) full = GemmTable<Ops, Dot, 32>::get(kR, kNV);
  if (g.kdim == 64) full = GemmTable<Ops, Dot, 64>::get(kR, kNV);
  if (g.kdim == 128) full = GemmTable<Ops, Dot, 128>::get(kR, kNV);
  for (int64_t r0 = 0; r0 < rows; r0 += kR) {
    const int r = static_cast<int>(std::min<int64_t>(kR, rows - r0));
    for (int64_t v0 = 0; v0 < vecs; v0 += kNV) {
      const int nv = static_cast<int>(std::min<int64_t>(kNV, vecs - v0));
      auto t = g;
      t.a = g.a + r0 * g.a_row;
      t.b = g.b + v0 * L;
      t.c = g.c + r0 * g.ldc + v0 * L;
      t.alpha = g.alpha != nullptr ? g.alpha + r0 : nullptr;
      (r == kR && nv == kNV ? full : GemmTable<Ops, Dot>::get(r, nv))(t);
    }
  }
}

}  // namespace qkv::kernels
