#include "qkv/attention_options.h"

#include <cmath>

#include <fmt/format.h>

#include "qkv/error.h"

namespace qkv {

double attention_scale(const std::optional<double>& scale, int64_t D) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
}

Kernel parse_kernel(std::string_view text, std::string_view what) {
  for (Kernel k : {Kernel::automatic, Kernel::reference, Kernel::fused})
    if (text == kernel_name(k)) return k;
  if (text == "automatic") return Kernel::automatic;
  throw Error(fmt::format("{} must be 'auto', 'reference' or 'fused', got '{}'", what, text));
}

Simd parse_simd(std::string_view text, std::string_view what) {
  for (Simd s : {Simd::automatic, Simd::avx512, Simd::avx2, Simd::neon, Simd::scalar})
    if (text == simd_name(s)) return s;
  if (text == "automatic" || text.empty()) return Simd::automatic;
  throw Error(fmt::format("{} must be 'auto', 'avx512', 'avx2', 'neon' or 'scalar', got '{}'", what, text));
}

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::automatic:
      return "auto";
    case Kernel::reference:
      return "reference";
    case Kernel::fused:
      return "fused";
  }
  return "unknown";
}

const char* simd_name(Simd simd) {
  switch (simd) {
    case Simd::automatic:
      return "auto";
    case Simd::avx512:
      return "avx512";
    case Simd::avx2:
      return "avx2";
    case Simd::scalar:
      return "scalar";
    case Simd::neon:
      return "neon";
  }
  return "unknown";
}

}  // namespace qkv
