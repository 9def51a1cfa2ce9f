// A key block's V rows for the forward tile (forward_tile.h): packed as fp32 for the P·V product,
// or checked for values that are not finite. Include after a family's
// <isa>/ops.h (Ops) and large_scores.h (widen).
#pragma once

namespace qkv::kernels {
namespace {

// dst [nb x dvp] = the nb rows of V at v (rows `row` elements apart, columns `col`) in fp32, zero
// beyond Dv.
template <class In>
void pack_values(const In* v, int64_t nb, int64_t row, int64_t col, int64_t Dv, int64_t dvp, float* dst) {
  for (int64_t jj = 0; jj < nb; ++jj) {
    for (int64_t e = 0; e < Dv; ++e) dst[jj * dvp + e] = widen(v[jj * row + e * col]);
    for (int64_t e = Dv; e < dvp; ++e) dst[jj * dvp + e] = 0.0f;
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

}  // namespace
}  // namespace qkv::kernels
