#include "kernels/dispatch.h"

#include <cstdlib>
#include <string>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <fmt/format.h>

#include "qkv/machine_info.h"

namespace qkv::kernels {

namespace {

#if defined(__x86_64__)
// AMX-TILE and AMX-BF16 (MachineInfo), and Linux's permission to use the tile data (the kernel
// enables it per process on request). QKV_AMX=0 leaves AMX unused.
bool amx_granted(const MachineInfo& m) {
  const char* env = std::getenv("QKV_AMX");
  if (env != nullptr && std::string(env) == "0") return false;
  if (!m.amx_bf16) return false;
#if defined(__linux__)
  constexpr int kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

// The instruction-set subsets are core's rule (MachineInfo), read here rather than tested again.
CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__)
  const MachineInfo& m = machine_info();
  f.avx2_fma = m.avx2;
  f.avx512 = m.avx512;
  f.avx512_bf16 = m.avx512_bf16;
  f.amx_bf16 = f.avx512_bf16 && amx_granted(m);
  f.split_k = !(m.vendor == "AuthenticAMD" && m.family == 0x1A);
  if (m.vendor == "GenuineIntel" && m.amx_bf16) f.fp32_key_block = 64;
#elif defined(__aarch64__)
  f.neon = true;
#endif
  return f;
}

// One row per family, best first; `runs` says whether this CPU can run it. Only the families
// compiled for this architecture are listed (the x86 ones are not built elsewhere).
struct FamilyEntry {
  KernelFamily kernels;
  bool (*runs)(const CpuFeatures&);
};

constexpr FamilyEntry kFamilies[] = {
#if defined(__x86_64__)
    {{Simd::avx512, &forward_tile_avx512, &backward_tile_avx512, &decode_tile_avx512, &exp2_avx512, &gemm_max_avx512},
     [](const CpuFeatures& f) { return f.avx512; }},
    {{Simd::avx2, &forward_tile_avx2, &backward_tile_avx2, &decode_tile_avx2, &exp2_avx2, &gemm_max_avx2},
     [](const CpuFeatures& f) { return f.avx2_fma; }},
#elif defined(__aarch64__)
    {{Simd::neon, &forward_tile_neon, &backward_tile_neon, &decode_tile_neon, &exp2_neon, &gemm_max_neon},
     [](const CpuFeatures& f) { return f.neon; }},
#endif
    {{Simd::scalar, &forward_tile_scalar, &backward_tile_scalar, &decode_tile_scalar, &exp2_scalar, &gemm_max_scalar},
     [](const CpuFeatures&) { return true; }},
};

const FamilyEntry* find_family(Simd path) {
  for (const FamilyEntry& e : kFamilies)
    if (e.kernels.simd == path) return &e;
  return nullptr;
}

bool available(Simd path) {
  const FamilyEntry* e = find_family(path);
  return e != nullptr && e->runs(cpu_features());
}

Simd best_path() {
  for (const FamilyEntry& e : kFamilies)
    if (e.runs(cpu_features())) return e.kernels.simd;
  return Simd::scalar;
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

// QKV_KEY_BLOCK as read once per process: 64 or 128, 0 when unset, or the message for another value.
struct EnvKeyBlock {
  int64_t keys = 0;
  std::string error;
};

const EnvKeyBlock& env_key_block() {
  static const EnvKeyBlock value = [] {
    EnvKeyBlock e;
    const char* env = std::getenv("QKV_KEY_BLOCK");
    const std::string text = env == nullptr ? "" : env;
    if (text == "64" || text == "128")
      e.keys = std::stoll(text);
    else if (!text.empty())
      e.error = fmt::format("QKV_KEY_BLOCK must be 64 or 128 (keys per block of the fp32 forward), got '{}'", text);
    return e;
  }();
  return value;
}

}  // namespace

int64_t fp32_key_block() {
  const EnvKeyBlock& env = env_key_block();
  if (!env.error.empty()) throw Error(env.error);
  return env.keys > 0 ? env.keys : cpu_features().fp32_key_block;
}

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

const KernelFamily& kernel_family(Simd path) {
  const FamilyEntry* e = find_family(path);
  if (e == nullptr) throw Error(fmt::format("no kernels for SIMD path {}", simd_name(path)));
  return e->kernels;
}

}  // namespace qkv::kernels
