// Scaled dot-product attention: out = softmax(scale * q kᵀ + mask) v, with the log-sum-exp of
// each row. Letters: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), N queries,
// M keys, D head dim of q and k, Dv head dim of v.
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/mask.h"
#include "qkv/tensor.h"

namespace qkv {

enum class Kernel { automatic, reference, fused };

// The instruction set of the fused kernel. automatic takes the best the CPU has, unless the
// environment variable QKV_SIMD (avx512, avx2 or scalar; read once per process) asks for a lower one.
enum class Simd { automatic, avx512, avx2, scalar };

struct AttentionOptions {
  // Multiplies q·k; defaults to 1/sqrt(D).
  std::optional<double> scale;
  Mask mask;
  // automatic picks the fused kernel when it is built, else the float64 reference.
  Kernel kernel = Kernel::automatic;
  // Threads for this call; 0 means default_num_threads().
  int num_threads = 0;
  // Forces a SIMD path of the fused kernel (tests, benchmarks); a path the CPU lacks is an Error.
  Simd simd = Simd::automatic;
};

// The sizes of one attention call, checked for consistency.
struct AttentionShape {
  int64_t B = 0, H = 0, Hkv = 0, N = 0, M = 0, D = 0, Dv = 0;
};

// Checks the ranks and sizes of q [B,H,N,D], k [B,Hkv,M,D], v [B,Hkv,M,Dv] and of every mask in
// `options` (key/query lengths, keep, bias, ALiBi), and returns the sizes. Throws qkv::Error
// naming the offending argument. D = 0 is refused; N = 0 or M = 0 is allowed (rows are masked).
AttentionShape check_attention_shapes(std::span<const int64_t> q, std::span<const int64_t> k,
                                      std::span<const int64_t> v, const AttentionOptions& options);

// QKV_NUM_THREADS if set to a positive integer, else the OpenMP default. Thread-safe.
int default_num_threads();

// Forward attention in fp32 (accumulating in fp32 on the fused path, float64 on the reference).
// out [B,H,N,Dv] is written; lse [B,H,N] is written unless empty. Any strides are accepted.
// A query row with no allowed key gets out = 0 and lse = -inf, never NaN. Thread-safe for
// distinct outputs; deterministic: the same inputs give bitwise the same outputs for any thread
// count.
void attention_forward(TensorView<float> out, TensorView<float> lse, TensorView<const float> q,
                       TensorView<const float> k, TensorView<const float> v, const AttentionOptions& options = {});

// The same with bf16 q, k, v: products accumulate in fp32 (AVX512_BF16 dot products where the CPU
// has them, else the inputs are widened to fp32) and P·V runs in fp32, so results equal attention
// on the inputs widened to fp32 up to fp32 rounding.
// Kernel::reference widens the inputs and runs the float64 reference.
void attention_forward(TensorView<float> out, TensorView<float> lse, TensorView<const bf16> q,
                       TensorView<const bf16> k, TensorView<const bf16> v, const AttentionOptions& options = {});

// The SIMD path ("avx512", "avx2" or "scalar") the fused kernel runs for `simd` on this CPU,
// honouring QKV_SIMD. Throws qkv::Error if that path is not available here or QKV_SIMD is invalid.
const char* simd_path_name(Simd simd = Simd::automatic);

}  // namespace qkv
