// What this machine is: cpuid's vendor, family, model and name, the class table, and the L3 one
// core can fill, from sysfs where the kernel exports it, else cpuid.
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "qkv/machine_info.h"

namespace qkv {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// sysfs's "32768K" or "32M" in bytes; 0 if unreadable.
int64_t parse_size(std::ifstream& file) {
  int64_t size = 0;
  std::string unit;
  if (!(file >> size) || size <= 0) return 0;
  file >> unit;
  if (unit == "K") return size << 10;
  if (unit == "M") return size << 20;
  if (unit == "G") return size << 30;
  return size;
}

// The level-3 cache of cpu0 as the kernel describes it (one instance: per CCX on AMD).
int64_t sysfs_l3() {
  for (int index = 0; index < 16; ++index) {
    const std::string dir = fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/", index);
    std::ifstream level(dir + "level");
    int value = 0;
    if (!(level >> value)) {
      if (index == 0) return 0;  // no cache directory at all (some hypervisors)
      continue;
    }
    if (value != 3) continue;
    std::ifstream size(dir + "size");
    return parse_size(size);
  }
  return 0;
}

#if defined(__x86_64__)
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) return {};
  return r;
}

// The deterministic cache leaf (4 on Intel, 0x8000001D on AMD): the size of one L3 instance.
int64_t deterministic_l3(unsigned leaf) {
  for (unsigned sub = 0; sub < 16; ++sub) {
    const Regs r = cpuid(leaf, sub);
    const unsigned type = r.a & 31u;
    if (type == 0) return 0;
    if (((r.a >> 5) & 7u) != 3) continue;
    const int64_t ways = (r.b >> 22) + 1, partitions = ((r.b >> 12) & 0x3ffu) + 1, line = (r.b & 0xfffu) + 1,
                  sets = int64_t{r.c} + 1;
    return ways * partitions * line * sets;
  }
  return 0;
}

// The most L3 one CCD (or CCX) of an AMD family holds, with 3D V-Cache: a larger size in cpuid
// 0x80000006 is the socket's total (a hypervisor without 0x8000001D reports that: 508 MiB on a
// 2-vCPU Zen 5 guest whose core fills 32 MiB), and the ordinary CCD's size is taken instead.
struct CcdL3 {
  int64_t plain, most;
};
CcdL3 amd_ccd_l3(int family, int model) {
  if (family == 0x17) return model < 0x30 ? CcdL3{8 * kMiB, 8 * kMiB} : CcdL3{16 * kMiB, 16 * kMiB};
  if (family == 0x19 || family == 0x1a) return {32 * kMiB, 96 * kMiB};
  return {0, 0};
}
#endif

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  s.erase(0, s.find_first_not_of(' '));
  return s;
}

MachineInfo detect() {
  MachineInfo m;
#if defined(__x86_64__)
  const Regs v = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4), std::memcpy(vendor + 4, &v.d, 4), std::memcpy(vendor + 8, &v.c, 4);
  m.vendor = vendor;
  const Regs one = cpuid(1);
  const int base_family = static_cast<int>((one.a >> 8) & 0xf), base_model = static_cast<int>((one.a >> 4) & 0xf);
  m.family = base_family + (base_family == 0xf ? static_cast<int>((one.a >> 20) & 0xff) : 0);
  m.model = base_model | (base_family == 0xf || base_family == 6 ? static_cast<int>((one.a >> 12) & 0xf0) : 0);
  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    m.brand = trim(brand);
  }
  // machine_info() may run in a static initializer, before libgcc's constructor sets up the tests.
  __builtin_cpu_init();
  m.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  m.avx512 = m.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  m.avx512_bf16 = m.avx512 && __builtin_cpu_supports("avx512bf16");
  m.avx512_vnni = m.avx512 && __builtin_cpu_supports("avx512vnni");
  const Regs seven = cpuid(7);
  m.amx_bf16 = (seven.d >> 24 & 1) != 0 && (seven.d >> 22 & 1) != 0;  // AMX-TILE, AMX-BF16
#endif
  m.class_name = machine_class_name(m.vendor, m.family, m.model, m.avx512, m.amx_bf16);

  if ((m.l3_bytes = sysfs_l3()) > 0) {
    m.l3_source = "sysfs";
    return m;
  }
#if defined(__x86_64__)
  const bool amd = m.vendor == "AuthenticAMD";
  if ((m.l3_bytes = deterministic_l3(amd ? 0x8000001D : 4)) > 0) {
    m.l3_source = amd ? "cpuid 0x8000001D" : "cpuid leaf 4";
    return m;
  }
  if (amd && cpuid(0x80000000).a >= 0x80000006) {
    const int64_t reported = int64_t{cpuid(0x80000006).d >> 18} * 512 * 1024;
    const CcdL3 ccd = amd_ccd_l3(m.family, m.model);
    if (ccd.most > 0 && reported > ccd.most) {
      m.l3_bytes = ccd.plain;
      m.l3_source = fmt::format(
          "one CCD of this family; cpuid 0x80000006 reports {} MiB, more than one CCD holds: the socket's total, "
          "as a hypervisor reports it",
          reported / kMiB);
    } else if (reported > 0) {
      m.l3_bytes = reported;
      m.l3_source = "cpuid 0x80000006";
    }
  }
#endif
  return m;
}

}  // namespace

std::string machine_class_name(const std::string& vendor, int family, int model, bool avx512, bool amx) {
  if (vendor == "AuthenticAMD") {
    // Zen 4 and the mobile Zen 5 parts run a 512-bit instruction as two 256-bit halves; desktop
    // and server Zen 5 have full 512-bit datapaths, so their AVX-512 peak is twice AVX2's.
    if (family == 0x17) return model < 0x30 ? "Zen / Zen+ (AVX2)" : "Zen 2 (AVX2)";
    if (family == 0x19) return avx512 ? "Zen 4 (double-pumped AVX-512)" : "Zen 3 (AVX2)";
    if (family == 0x1a) {
      const bool mobile = (model >= 0x20 && model <= 0x2f) || (model >= 0x60 && model <= 0x7f);
      return mobile ? "Zen 5 mobile (double-pumped AVX-512)" : "Zen 5 (full-width AVX-512)";
    }
  }
  if (vendor == "GenuineIntel" && family == 6) {
    switch (model) {
      case 0x55:
        return "Skylake-SP";  // and Cascade Lake, the same core
      case 0x6a:
      case 0x6c:
        return "Ice Lake-SP";
      case 0x8f:
        return "Sapphire Rapids";
      case 0xcf:
        return "Emerald Rapids";
      case 0xad:
      case 0xae:
        return "Granite Rapids";
      default:
        // Guests are often shown a model of the hypervisor's choosing (family 6 model 167, a
        // client part's, on a Xeon with AMX and 2 MiB of L2 per core): AMX names the server class.
        if (amx) return fmt::format("Intel Xeon with AMX (family 6 model {})", model);
        break;
    }
  }
  if (vendor.empty()) {
#if defined(__aarch64__)
    return "AArch64 (NEON)";
#else
    return "unknown CPU";
#endif
  }
  return fmt::format("{} family {} model {} ({})", vendor, family, model, avx512 ? "AVX-512" : "no AVX-512");
}

std::string machine_class_name(const std::string& vendor, int family, int model, bool avx512) {
  return machine_class_name(vendor, family, model, avx512, false);
}

const MachineInfo& machine_info() {
  static const MachineInfo info = detect();
  return info;
}

int64_t l3_cache_bytes() { return machine_info().l3_bytes; }

int64_t memory_probe_bytes() { return std::max(2 * l3_cache_bytes(), int64_t{256} << 20); }

bool stays_in_cache(double bytes) {
  const int64_t l3 = l3_cache_bytes();
  return l3 > 0 && bytes < 0.5 * static_cast<double>(l3);
}

}  // namespace qkv
