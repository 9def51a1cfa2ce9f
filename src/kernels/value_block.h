// A key block's V rows for the forward tile (forward_tile.h): packed as fp32 for the P·V product,
// checked for values that are not finite, or summed row by row where they are not. Include after a family's
// <isa>/ops.h (Ops) and large_scores.h (widen).
#pragma once

namespace qkv::kernels {
namespace {

// dst [nb x dvp] = the nb rows of V at v (rows `row` elements apart, columns `col`) in fp32, zero
// beyond Dv.
template <class In>
void pack_values(const In* v, int64_t nb, int64_t row, int64_t col, int64_t Dv, int64_t dvp, float* dst) {
  bool copy = false;  // contiguous floats (rows not aligned to the vectors): a copy per row
  if constexpr (std::is_same_v<In, float>) copy = col == 1;
  for (int64_t jj = 0; jj < nb; ++jj) {
    if (copy)
      std::memcpy(dst + jj * dvp, v + jj * row, static_cast<std::size_t>(Dv) * sizeof(float));
    else
      for (int64_t e = 0; e < Dv; ++e) dst[jj * dvp + e] = widen(v[jj * row + e * col]);
    for (int64_t e = Dv; e < dvp; ++e) dst[jj * dvp + e] = 0.0f;
  }
}

// o = alpha ⊙ o + pv over `rows` rows of dvp floats (a multiple of the lanes): a key block's P·V,
// summed on its own in pv, joins the running O in one rounding.
template <class Ops>
void fold_block(float* o, const float* pv, const float* alpha, int64_t rows, int64_t dvp) {
  for (int64_t r = 0; r < rows; ++r) {
    const typename Ops::V a = Ops::set1(alpha[r]);
    for (int64_t e = r * dvp; e < (r + 1) * dvp; e += Ops::kLanes)
      Ops::store(o + e, Ops::fma(a, Ops::load(o + e), Ops::load(pv + e)));
  }
}

// The same for O held transposed, ot [dvp x ld] (the AMX forward's): column g of ot is query
// row g, so alpha is a vector over `lanes` rows (a multiple of the lanes).
template <class Ops>
void fold_block_transposed(float* ot, const float* pvt, const float* alpha, int64_t lanes, int64_t dvp, int64_t ld) {
  for (int64_t g = 0; g < lanes; g += Ops::kLanes) {
    const typename Ops::V a = Ops::load(alpha + g);
    for (int64_t e = 0; e < dvp; ++e)
      Ops::store(ot + e * ld + g, Ops::fma(a, Ops::load(ot + e * ld + g), Ops::load(pvt + e * ld + g)));
  }
}

// Whether any of the nb rows of V at v (as pack_values) holds an Inf or a NaN.
template <class Ops, class In>
bool has_nonfinite(const In* v, int64_t nb, int64_t row, int64_t col, int64_t Dv) {
  constexpr int64_t L = Ops::kLanes;
  if constexpr (std::is_same_v<In, float>) {
    if (col == 1) {
      typename Ops::V acc = Ops::zero();  // x · 0 is NaN exactly when x is Inf or NaN
      const int64_t full = Dv / L * L;
      bool tail = false;
      for (int64_t jj = 0; jj < nb; ++jj) {
        for (int64_t e = 0; e < full; e += L) acc = Ops::fma(Ops::load(v + jj * row + e), Ops::zero(), acc);
        for (int64_t e = full; e < Dv; ++e) tail |= !std::isfinite(v[jj * row + e]);
      }
      return tail || Ops::any_nan(acc);
    }
  }
  bool bad = false;
  for (int64_t jj = 0; jj < nb; ++jj)
    for (int64_t e = 0; e < Dv; ++e) bad |= !std::isfinite(widen(v[jj * row + e * col]));
  return bad;
}

// o = P · V with each row over its own keys only, in plain loops: the forward tile's rare case,
// where a NaN or Inf in V must not reach rows whose band leaves its key out (0 · NaN = NaN).
// pt [nb x ls] = Pᵀ of the block at key j0, v its rows (as pack_values), row r < rows of o takes
// keys [lo[r], hi[r]) if live[r]. o's element (r, e) lies at r·o_row + e·o_col (O as rows, or
// transposed for AMX tiles); its columns past Dv up to dvp are zeroed.
template <class In>
void accumulate_in_bands(const float* pt, int64_t ls, const In* v, int64_t row, int64_t col, int64_t Dv, int64_t dvp,
                         int64_t rows, const bool* live, const int64_t* lo, const int64_t* hi, int64_t j0, int64_t nb,
                         float* o, int64_t o_row, int64_t o_col) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = live[r] ? std::clamp<int64_t>(lo[r] - j0, 0, nb) : 0;
    const int64_t last = live[r] ? std::clamp<int64_t>(hi[r] - j0, first, nb) : first;
    float* out = o + r * o_row;
    for (int64_t e = 0; e < Dv; ++e) {
      float acc = 0.0f;
      for (int64_t jj = first; jj < last; ++jj) acc += pt[jj * ls + r] * widen(v[jj * row + e * col]);
      out[e * o_col] = acc;
    }
    for (int64_t e = Dv; e < dvp; ++e) out[e * o_col] = 0.0f;
  }
}

}  // namespace
}  // namespace qkv::kernels
