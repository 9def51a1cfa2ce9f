// Sinusoidal positional encoding (include/qkv/positions.h).
#include "qkv/positions.h"

#include <cmath>

#include <fmt/format.h>

#include "qkv/error.h"

namespace qkv {

double sinusoidal_position(int64_t pos, int64_t index, int64_t E) {
  const double angle =
      static_cast<double>(pos) / std::pow(10000.0, static_cast<double>(index - index % 2) / static_cast<double>(E));
  return index % 2 == 0 ? std::sin(angle) : std::cos(angle);
}

void add_sinusoidal_positions(TensorView<float> x) {
  if (x.rank() != 2 && x.rank() != 3)
    throw Error(fmt::format("positional encoding: x must be [N, E] or [B, N, E], got rank {}", x.rank()));
  const int64_t B = x.rank() == 3 ? x.dim(0) : 1;
  const int64_t N = x.dim(x.rank() - 2), E = x.dim(x.rank() - 1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e) {
        float& v = x.rank() == 3 ? x(b, n, e) : x(n, e);
        v = static_cast<float>(static_cast<double>(v) + sinusoidal_position(n, e, E));
      }
}

}  // namespace qkv
