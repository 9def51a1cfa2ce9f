// What one attention call asks for (kernel, SIMD family, scale, masks, threads) and the sizes it
// has. Every layer from the kernels up speaks this vocabulary, so it sits in core; the rules a
// call obeys (the default scale, the names users type) are written here once.
// Letters: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), N queries, M keys,
// D head dim of q and k, Dv head dim of v.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

#include "qkv/dropout.h"
#include "qkv/mask.h"

namespace qkv {

enum class Kernel { automatic, reference, fused };

// The instruction set of the fused kernel. automatic takes the best the CPU has, unless the
// environment variable QKV_SIMD (read once per process, parsed by parse_simd) asks for another.
enum class Simd { automatic, avx512, avx2, scalar, neon };

struct AttentionOptions {
  // Multiplies q·k; unset means 1/sqrt(D) (attention_scale).
  std::optional<double> scale;
  Mask mask;
  // automatic and fused run the fused kernel (always built: its scalar family needs no SIMD);
  // reference runs the float64 oracle and rounds once (tests, small inputs, float64 callers).
  Kernel kernel = Kernel::automatic;
  // Threads for this call at most; 0 means default_num_threads(). The fused kernels wake one
  // thread per ~2^19 multiply-adds of the call at most, so a short call runs on the calling
  // thread; no result depends on the count.
  int num_threads = 0;
  // Forces a SIMD path of the fused kernel (tests, benchmarks); a path the CPU lacks is an Error.
  Simd simd = Simd::automatic;
  // Attention dropout (qkv/dropout.h): off unless dropout.p > 0. The forward and the backward of one
  // step must be given the same Dropout.
  Dropout dropout;
};

// QKV_NUM_THREADS if set to an integer in [1, kMaxThreads], else the OpenMP default (a value it
// cannot use is ignored here; environment_num_threads names it). Thread-safe.
int default_num_threads();

// QKV_NUM_THREADS as default_num_threads reads it: nullopt when unset or empty; throws qkv::Error
// naming the value when it is anything but a decimal integer in [1, kMaxThreads]. Thread-safe.
std::optional<int> environment_num_threads();

// Most threads any call runs on: a request for more (e.g. 100000) would exhaust the process's
// threads inside OpenMP, which cannot report it.
constexpr int kMaxThreads = 4096;

// The threads a call asked for `requested` (0 or less: default_num_threads()) runs with `items`
// independent tasks (default: not known, the kernel caps it again): at least 1, at most items,
// kMaxThreads and what a capped address space leaves room for (threads_within_address_space). No
// result depends on it. Thread-safe.
int resolve_num_threads(int requested, int64_t items = std::numeric_limits<int64_t>::max());

// The largest head dim (D, Dv) any path takes. Kernels keep tiles of up to 64 rows of D floats per
// buffer, grouped up to 16 tiles; 2^20 keeps every such size far inside int64 (D = 2^60 wrapped
// the tile group's size to 0, a SIGFPE) while real models use 64-256 (embedding widths as head
// dims of the parameter-free layer: up to a few thousand).
constexpr int64_t kMaxHeadDim = int64_t{1} << 20;

// The sizes of one attention call, checked for consistency (check_attention_shapes).
struct AttentionShape {
  int64_t B = 0, H = 0, Hkv = 0, N = 0, M = 0, D = 0, Dv = 0;
};

// The scale a call with head dim D uses: options.scale if set, else 1/sqrt(D). Pure.
double attention_scale(const std::optional<double>& scale, int64_t D);

// Throws qkv::Error "<caller>: scale must be finite and at most FLT_MAX ..." for a scale the fp32
// kernels cannot multiply by (they round it to float). Unset passes. Pure.
void require_scale(const std::optional<double>& scale, std::string_view caller);

// Throws qkv::Error "<caller>: H = .. query heads is not a positive multiple of Hkv = .. key/value
// heads" unless H > 0, Hkv > 0 and Hkv divides H: every query head reads key/value head h / (H / Hkv)
// (grouped-query attention). The one statement of the rule for every entry point. Pure.
void require_head_groups(int64_t H, int64_t Hkv, std::string_view caller);

// The names users type for kernels and SIMD paths, for the CLI, Python and QKV_SIMD alike.
// Kernel: "auto" (or "automatic"), "reference", "fused". Simd: "auto" (or "automatic" or ""),
// "avx512", "avx2", "neon", "scalar". Throws qkv::Error "<what> must be 'auto', ..., got '<text>'".
Kernel parse_kernel(std::string_view text, std::string_view what = "kernel");
Simd parse_simd(std::string_view text, std::string_view what = "simd");

// The canonical name of each value ("auto" for automatic), as parse_* accepts it.
const char* kernel_name(Kernel kernel);
const char* simd_name(Simd simd);

}  // namespace qkv
