// families.h's AVX2 micro-kernel, compiled for AVX2 with the function that hands it out; the
// test calls that only after checking the CPU.
#if defined(__x86_64__)
#include "families.h"

#include "kernels/kernel_deps.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2")
#include "kernels/avx2/ops.h"
#include "kernels/microkernel.h"

#include "gemm_of.h"  // after the micro-kernel, which it calls

namespace qkv::test {
Family avx2_family() { return family_of<kernels::Avx2>("avx2"); }
}  // namespace qkv::test

#pragma GCC pop_options
#endif
