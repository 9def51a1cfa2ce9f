// qkv_kernel_check's main (cmake/kernel_check.cmake): says which SIMD path the automatic choice
// runs and which paths this build has, then runs the tests, so a cross run (scripts/arm64.sh,
// under qemu-user) shows what it checked.
#include <cstdio>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "qkv/attention.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  std::printf("qkv_kernel_check: SIMD path %s (automatic); paths built and runnable here:", qkv::simd_path_name());
  for (qkv::Simd s : qkv::test::available_paths()) std::printf(" %s", qkv::simd_name(s));
  std::printf("\n");
  return RUN_ALL_TESTS();
}
