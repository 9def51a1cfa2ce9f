// The decode kernel with NEON (AArch64 only). fp16 pages widen with FCVTL, which AArch64's
// Advanced SIMD always has.
#include "kernels/kernel_deps.h"
#include "kernels/decode_kernel.h"
#include "core/kv_codec.h"

#include "kernels/simd_neon.h"

namespace qkv::kernels {
namespace {

struct NeonDecode : Neon {
  static float hsum(V x) { return vaddvq_f32(x); }
  static float hmax(V x) { return vmaxvq_f32(x); }
  // Lane j of the result = the sum of the lanes of a[j], j < 4: two rounds of pairwise adds.
  static V reduce_lanes(const V* a) { return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3])); }
  static V load_f16(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
  static V load_bf16(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
  static V load_i8(const int8_t* p) {
    int32_t four;
    std::memcpy(&four, p, sizeof four);  // exactly 4 bytes: the next page may not be there
    const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(four)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
  }
};

}  // namespace
}  // namespace qkv::kernels

#include "kernels/decode_chunk.h"

namespace qkv::kernels {

void decode_chunk_neon(const DecodeParams& p, const DecodeTask& task, Workspace& ws) {
  decode_chunk<NeonDecode>(p, task, ws);
}

void decode_widen_neon(KVDtype dtype, const void* src, int64_t n, float* dst) {
  widen_row<NeonDecode>(dtype, static_cast<const char*>(src), n, dst, n);
}

}  // namespace qkv::kernels
