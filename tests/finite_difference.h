// Finite differences for gradient checks in float64.
#pragma once

#include <functional>

namespace qkv::test {

// Fourth-order central difference of f with respect to *x (restored afterwards), step 1e-3.
inline double derivative(double* x, const std::function<double()>& f) {
  constexpr double h = 1e-3;
  const double x0 = *x;
  auto at = [&](double delta) {
    *x = x0 + delta;
    return f();
  };
  const double d = (8.0 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12.0 * h);
  *x = x0;
  return d;
}

}  // namespace qkv::test
