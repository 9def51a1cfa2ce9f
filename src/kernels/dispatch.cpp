#include "kernels/dispatch.h"

#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace qkv::kernels {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = f.avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  // GCC 12's __builtin_cpu_supports knows avx512bf16.
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  return f;
}

bool available(Simd path) {
  const CpuFeatures& f = cpu_features();
  switch (path) {
    case Simd::avx512: return f.avx512;
    case Simd::avx2: return f.avx2_fma;
    case Simd::scalar: return true;
    case Simd::automatic: return true;
  }
  return false;
}

Simd best_path() {
  const CpuFeatures& f = cpu_features();
  return f.avx512 ? Simd::avx512 : f.avx2_fma ? Simd::avx2 : Simd::scalar;
}

// QKV_SIMD as read once per process: the parsed path, or the message for an invalid value.
struct EnvSimd {
  Simd path = Simd::automatic;
  std::string error;
};

const EnvSimd& env_simd() {
  static const EnvSimd value = [] {
    EnvSimd e;
    const char* env = std::getenv("QKV_SIMD");
    try {
      e.path = parse_simd(env == nullptr ? "" : env, "QKV_SIMD");
    } catch (const Error& error) {
      e.error = error.what();
    }
    return e;
  }();
  return value;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

Simd resolve_simd(Simd requested) {
  if (requested == Simd::automatic) {
    const EnvSimd& env = env_simd();
    if (!env.error.empty()) throw Error(env.error);
    requested = env.path;
    if (requested == Simd::automatic) return best_path();
  }
  if (!available(requested))
    throw Error(fmt::format("SIMD path {} was requested but this CPU does not support it (best here: {})",
                            simd_name(requested), simd_name(best_path())));
  return requested;
}

}  // namespace qkv::kernels
