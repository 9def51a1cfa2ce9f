// families.h's AVX-512 micro-kernel, compiled for AVX-512 with the function that hands it out;
// the test calls that only after checking the CPU.
#if defined(__x86_64__)
#include "families.h"

#include "kernels/kernel_deps.h"

#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")
#include "kernels/avx512/ops.h"
#include "kernels/microkernel.h"

#include "gemm_of.h"  // after the micro-kernel, which it calls

namespace qkv::test {
Family avx512_family() { return family_of<kernels::Avx512>("avx512"); }
}  // namespace qkv::test

#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
