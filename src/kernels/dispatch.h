// Which SIMD family the fused kernels run: the CPU's features, QKV_SIMD, and the caller's choice;
// and the one table of each family's kernels: a new family is its folder (<isa>/) and one row of it.
#pragma once

#include "kernels/backward.h"
#include "kernels/decode.h"
#include "kernels/forward.h"
#include "qkv/attention_options.h"

namespace qkv::kernels {

// What this CPU (and OS) can run. Detected once; thread-safe.
struct CpuFeatures {
  bool avx2_fma = false;
  bool avx512 = false;       // F, BW, DQ, VL
  bool avx512_bf16 = false;  // vdpbf16ps
  bool amx_bf16 = false;     // AMX-TILE and AMX-BF16, granted by the OS; QKV_AMX=0 turns it off
  bool neon = false;         // AArch64's Advanced SIMD (every AArch64 CPU)
  // Whether block products split a long K into chunks (GemmArgs::split_k, microkernel.h): measured
  // to pay on Skylake-SP, and to cost 1-3% on Zen 5 (AMD family 1Ah), which runs K in one pass.
  bool split_k = true;
  // Keys per block of the fp32 forward (ForwardParams::key_block), at most a family's
  // Ops::kKeyBlock: 64 on Intel's cores with AMX, where the AVX-512 forward ran 3-5% faster than
  // with 128 (S3, S4, S6, S3q50; its bf16 on tiles keeps 128, which ran 15% faster there); 128
  // elsewhere, where it was tuned.
  int64_t fp32_key_block = 128;
};
const CpuFeatures& cpu_features();

// The fp32 forward's keys per block: QKV_KEY_BLOCK (64 or 128) when set, for measuring either on
// any CPU; else CpuFeatures::fp32_key_block. Throws qkv::Error for another QKV_KEY_BLOCK.
int64_t fp32_key_block();

// Resolves a request to a concrete path (never Simd::automatic): the caller's explicit choice,
// else QKV_SIMD, else the best path the CPU has. Throws qkv::Error for a path the CPU lacks or
// an invalid QKV_SIMD value.
Simd resolve_simd(Simd requested);

// Every kernel of one SIMD family.
struct KernelFamily {
  Simd simd;
  ForwardFn forward;
  BackwardFn backward;
  DecodeFn decode;
  Exp2Fn exp2;
  GemmMaxFn gemm_max;
};

// The kernels of a resolved path (not Simd::automatic). Thread-safe.
const KernelFamily& kernel_family(Simd path);

}  // namespace qkv::kernels
