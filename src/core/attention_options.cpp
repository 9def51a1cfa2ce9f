#include "qkv/attention_options.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>
#include <omp.h>

#include "qkv/address_space.h"
#include "qkv/error.h"

namespace qkv {

std::optional<int> environment_num_threads() {
  const char* env = std::getenv("QKV_NUM_THREADS");
  if (env == nullptr || *env == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(env, &end, 10);
  if (end == env || *end != '\0' || errno == ERANGE || n < 1 || n > kMaxThreads ||
      !std::isdigit(static_cast<unsigned char>(*env)))
    throw Error(fmt::format("QKV_NUM_THREADS={}: expected a decimal integer from 1 to {}", env, kMaxThreads));
  return static_cast<int>(n);
}

int default_num_threads() {
  try {
    if (const std::optional<int> n = environment_num_threads()) return *n;
  } catch (const Error&) {
  }
  return omp_get_max_threads();
}

// Capped by the address space last: a thread libgomp cannot create exits the process, and the
// results are the same bits with fewer threads.
int resolve_num_threads(int requested, int64_t items) {
  const int64_t wanted = requested > 0 ? requested : default_num_threads();
  return threads_within_address_space(
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({wanted, items, kMaxThreads}))));
}

double attention_scale(const std::optional<double>& scale, int64_t D) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
}

void require_scale(const std::optional<double>& scale, std::string_view caller) {
  if (scale && !(std::fabs(*scale) <= std::numeric_limits<float>::max()))
    throw Error(
        fmt::format("{}: scale must be finite and at most FLT_MAX (3.4e38) in magnitude, got {}", caller, *scale));
}

void require_head_groups(int64_t H, int64_t Hkv, std::string_view caller) {
  if (H <= 0 || Hkv <= 0 || H % Hkv != 0)
    throw Error(
        fmt::format("{}: H = {} query heads is not a positive multiple of Hkv = {} key/value heads", caller, H, Hkv));
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
