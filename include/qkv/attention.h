// Scaled dot-product attention: out = softmax(scale * q kᵀ + mask) v, with the log-sum-exp of
// each row. Letters: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), N queries,
// M keys, D head dim of q and k, Dv head dim of v.
#pragma once

#include <cstdint>
#include <span>

#include "qkv/attention_options.h"
#include "qkv/tensor.h"

namespace qkv {

// Checks the ranks and sizes of q [B,H,N,D], k [B,Hkv,M,D], v [B,Hkv,M,Dv] and of every mask in
// `options` (key/query lengths, keep, bias, ALiBi), and returns the sizes. Throws qkv::Error
// naming the offending argument. D = 0 and head dims past kMaxHeadDim are refused; N = 0 or M = 0
// is allowed (rows are masked).
AttentionShape check_attention_shapes(std::span<const int64_t> q, std::span<const int64_t> k,
                                      std::span<const int64_t> v, const AttentionOptions& options);

// Forward attention in fp32 (accumulating in fp32 on the fused path, float64 on the reference).
// out [B,H,N,Dv] is written; lse [B,H,N] is written unless empty. Any strides are accepted, but an
// output needs one place per element and memory of its own: out or lse sharing bytes with q, k, v,
// a mask or each other is refused with qkv::Error (the kernels read inputs after writing rows).
// Accuracy (fp32 rule): within 2e-5·(1 + max|ref|) of the float64 reference plus the rounding of
// scores of size |s| (4·eps32·|s| relative), and within FlashAttention's rule below with x_pt the
// fp32 composite (tests/large_score_test.cpp). A score whose |q|·|k|·scale exceeds 32 is summed
// again in double, since one fp32 chain over d rounds at the size of the vectors whatever the
// score: inputs where every score does (q·50 in FlashAttention's tests) take ~2.3x the forward's
// time and ~1.6x the backward's; unit-variance inputs (|q|·|k|·scale about √D) do not.
// Throws qkv::Error when q, k and v (and the bias) hold no NaN or +inf but the result overflowed
// fp32 (the float64 reference, Kernel::reference, computes such inputs; its lse can still pass
// fp32's range, which lse_to_float32 below refuses).
// Results below FLT_MIN (1.2e-38) may come out as 0: the kernels flush subnormal results, which
// cost x86 a microcode assist each (the caller's floating-point mode is restored on return).
// A query row with no allowed key gets out = 0 and lse = -inf, never NaN. Thread-safe for
// distinct outputs; deterministic: the same inputs give bitwise the same outputs for any thread
// count.
void attention_forward(TensorView<float> out, TensorView<float> lse, TensorView<const float> q,
                       TensorView<const float> k, TensorView<const float> v, const AttentionOptions& options = {});

// The same with bf16 q, k, v: q·k products are exact and accumulate in fp32. On CPUs with
// AVX512_BF16 both products run on vdpbf16ps, with the softmax weights P rounded to bf16 for P·V
// (2^-9 relative); with AMX-BF16 too (and D a multiple of 32, Dv of 16) on AMX tiles instead
// (environment QKV_AMX=0 turns them off); elsewhere the inputs are widened and the fp32 kernel runs.
// Accuracy (bf16 rule, FlashAttention's for low precision): max|out − out_ref| ≤
// 2·max|out_pt − out_ref| + 1e-5, out_ref = float64 attention on the same bf16 inputs, out_pt =
// PyTorch's composite softmax(q·kᵀ·scale [+ mask])·v run on bf16 tensors (measured: at most 0.6 of
// that bound on the property cases; about 5e-4 relative to 1 + max|out| for N(0, 1) inputs).
// Kernel::reference widens the inputs and runs the float64 reference.
void attention_forward(TensorView<float> out, TensorView<float> lse, TensorView<const bf16> q, TensorView<const bf16> k,
                       TensorView<const bf16> v, const AttentionOptions& options = {});

// attention_forward with lse in float64 (a name of its own, so `{}` for "no lse" stays
// unambiguous above): the kernel's own normalizer m + log(l) with no final rounding to
// fp32. Pass it to attention_backward: at large scores (|lse| ~ 100, one fp32 ulp = 7.6e-6) an
// fp32 lse puts up to 3.8e-6 of relative error into every P the backward recomputes, which
// PyTorch's fp32 composite does not have; with this one the gradients meet FlashAttention's rule.
void attention_forward_lse64(TensorView<float> out, TensorView<double> lse, TensorView<const float> q,
                             TensorView<const float> k, TensorView<const float> v,
                             const AttentionOptions& options = {});
void attention_forward_lse64(TensorView<float> out, TensorView<double> lse, TensorView<const bf16> q,
                             TensorView<const bf16> k, TensorView<const bf16> v, const AttentionOptions& options = {});

// An lse of attention_forward_lse64 rounded to float32, as attention_forward returns it. Throws
// qkv::Error for a finite lse past float32's range (scores beyond 3.4e38, which the reference
// kernel computes in double), rather than returning inf: ask for lse in float64 instead.
// Thread-safe.
float lse_to_float32(double lse);

// The SIMD path ("avx512", "avx2", "neon" or "scalar") the fused kernel runs for `simd` on this CPU,
// honouring QKV_SIMD. Throws qkv::Error if that path is not available here or QKV_SIMD is invalid.
const char* simd_path_name(Simd simd = Simd::automatic);

}  // namespace qkv
