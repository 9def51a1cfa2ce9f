// The fused forward kernel's promises about threads and memory: bitwise the same result for any
// thread count, and per-thread tile buffers only (no N x M allocation).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "qkv/address_space.h"
#include "qkv/attention.h"
#include "test_util.h"

namespace qkv {
namespace {

bool bitwise_equal(const Tensor<float>& a, const Tensor<float>& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), sizeof(float) * a.numel()) == 0;
}

// Shapes with several tiles per head, tails, a causal band and GQA, so threads split rows
// differently each time.
TEST(FusedThreads, OutputsAreBitwiseEqualFor1_2_3Threads) {
  test::Rng rng("FusedThreads.Bitwise");
  Tensor<float> q = rng.normal32({2, 4, 333, 64}), k = rng.normal32({2, 2, 301, 64}), v = rng.normal32({2, 2, 301, 40});
  Tensor<float> bias = rng.normal32({1, 1, 333, 301});
  for (Simd simd : test::available_paths()) {
    for (int masks = 0; masks < 2; ++masks) {
      AttentionOptions options;
      options.simd = simd;
      if (masks == 1) {
        options.mask.causal = CausalAlign::bottom_right;
        options.mask.bias = broadcast_mask(bias.cview(), 2, 4, 333, 301, "bias");
        options.mask.key_lengths = {301, 250};
      }
      Tensor<float> out1({2, 4, 333, 40}), lse1({2, 4, 333});
      options.num_threads = 1;
      attention_forward(out1.view(), lse1.view(), q.cview(), k.cview(), v.cview(), options);
      for (int threads : {2, 3, 100000}) {  // 100000: capped (resolve_num_threads), not a crash
        Tensor<float> out({2, 4, 333, 40}), lse({2, 4, 333});
        options.num_threads = threads;
        attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
        EXPECT_TRUE(bitwise_equal(out, out1)) << simd_path_name(simd) << " threads " << threads << " masks " << masks;
        EXPECT_TRUE(bitwise_equal(lse, lse1)) << simd_path_name(simd) << " threads " << threads << " masks " << masks;
      }
    }
  }
}

// A thread count is capped by the call's tasks and kMaxThreads: asking for 100000 crashed the decode
// (OpenMP could not create them) before every call resolved its count in one place.
TEST(Threads, ResolveCapsTheRequestByTasksAndTheLimit) {
  EXPECT_EQ(resolve_num_threads(3, 10), 3);
  EXPECT_EQ(resolve_num_threads(100000, 7), 7);
  EXPECT_EQ(resolve_num_threads(100000, int64_t{1} << 40), kMaxThreads);
  EXPECT_EQ(resolve_num_threads(5, 0), 1);
  EXPECT_EQ(resolve_num_threads(0, int64_t{1} << 40), default_num_threads());
  EXPECT_EQ(resolve_num_threads(-2, 1), 1);
}

// The process's size (VmSize) in bytes, which RLIMIT_AS bounds.
unsigned long long address_space_in_use() {
  std::ifstream statm("/proc/self/statm");
  unsigned long long pages = 0;
  statm >> pages;
  return pages * static_cast<unsigned long long>(sysconf(_SC_PAGESIZE));
}

// Under RLIMIT_AS the count also fits the threads' stacks and arenas in what the limit leaves
// above the process's size (libgomp, failing to create a thread, exits the process); with no room
// for one more thread the call runs on the calling thread.
TEST(Threads, ResolveCapsTheRequestByTheAddressSpaceLeft) {
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  const unsigned long long per_thread = openmp_thread_bytes();
  EXPECT_GT(per_thread, 64ull << 20);  // glibc's arena alone reserves 64 MiB
  std::vector<int> got;
  for (const double room : {2.5, 0.5, 1000.0}) {  // threads' worth of room beside the calling one
    struct rlimit capped = saved;
    capped.rlim_cur = address_space_in_use() + static_cast<unsigned long long>(room * static_cast<double>(per_thread));
    if (saved.rlim_cur != RLIM_INFINITY && capped.rlim_cur > saved.rlim_cur) GTEST_SKIP() << "RLIMIT_AS is set";
    ASSERT_EQ(setrlimit(RLIMIT_AS, &capped), 0);
    got.push_back(resolve_num_threads(16, int64_t{1} << 40));
    ASSERT_EQ(setrlimit(RLIMIT_AS, &saved), 0);
  }
  EXPECT_EQ(got, (std::vector<int>{3, 1, 16}));
  EXPECT_EQ(threads_within_address_space(16), 16);  // unlimited
}

// One head, few rows: the work is split into small tiles so that both cores get some; the
// result must still not depend on the thread count.
TEST(FusedThreads, SingleHeadShortSequenceIsDeterministic) {
  test::Rng rng("FusedThreads.SingleHead");
  Tensor<float> q = rng.normal32({1, 1, 70, 128}), k = rng.normal32({1, 1, 900, 128}),
                v = rng.normal32({1, 1, 900, 128});
  Tensor<float> out1({1, 1, 70, 128}), out3({1, 1, 70, 128});
  AttentionOptions options;
  options.num_threads = 1;
  attention_forward(out1.view(), {}, q.cview(), k.cview(), v.cview(), options);
  options.num_threads = 3;
  attention_forward(out3.view(), {}, q.cview(), k.cview(), v.cview(), options);
  EXPECT_TRUE(bitwise_equal(out1, out3));
}

// bf16 inputs with a window mask, 190 keys (a partial last block) and value dim dv, on every path.
void expect_bf16_bitwise_for_1_2_3_threads(const char* seed, int64_t dv) {
  test::Rng rng(seed);
  Tensor<float> q32 = rng.normal32({1, 3, 200, 64}), k32 = rng.normal32({1, 3, 190, 64}),
                v32 = rng.normal32({1, 3, 190, dv});
  auto round = [](const Tensor<float>& t) {
    Tensor<bf16> b(t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) b[i] = float_to_bf16(t[i]);
    return b;
  };
  const Tensor<bf16> q = round(q32), k = round(k32), v = round(v32);
  for (Simd simd : test::available_paths()) {
    AttentionOptions options;
    options.simd = simd;
    options.mask.window = Window{50, 10};
    Tensor<float> out1({1, 3, 200, dv});
    options.num_threads = 1;
    attention_forward(out1.view(), {}, q.cview(), k.cview(), v.cview(), options);
    for (int threads : {2, 3}) {
      Tensor<float> out({1, 3, 200, dv});
      options.num_threads = threads;
      attention_forward(out.view(), {}, q.cview(), k.cview(), v.cview(), options);
      EXPECT_TRUE(bitwise_equal(out, out1)) << simd_path_name(simd) << " threads " << threads;
    }
  }
}

TEST(FusedThreads, Bf16OutputsAreBitwiseEqualFor1_2_3Threads) {
  expect_bf16_bitwise_for_1_2_3_threads("FusedThreads.Bf16", 59);
}

// D = Dv = 64 takes the AMX tile products where the CPU has them (dispatch.cpp).
TEST(FusedThreads, Bf16TileProductsAreBitwiseEqualFor1_2_3Threads) {
  expect_bf16_bitwise_for_1_2_3_threads("FusedThreads.Bf16Tiles", 64);
}

// Peak resident memory in kB since the last reset_peak_rss(), from /proc/self/status.
long peak_rss_kb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// N = M = 65536, D = 64: an N x M score matrix would be 16 GiB. With a causal sliding window of
// 256 keys the run takes well under a second, and the kernel's memory does not depend on the mask.
// Budget: 16 MiB of growth over the 64 MiB of inputs and outputs (per-thread tiles are < 1 MiB).
TEST(FusedMemory, NoNxMAllocationAt65536) {
  const int64_t N = 65536, D = 64;
  test::Rng rng("FusedMemory.65536");
  Tensor<float> q = rng.normal32({1, 1, N, D}), k = rng.normal32({1, 1, N, D}), v = rng.normal32({1, 1, N, D});
  Tensor<float> out({1, 1, N, D}), lse({1, 1, N});
  for (int64_t i = 0; i < out.numel(); ++i) out[i] = 1.0f;  // resident before the measurement
  for (int64_t i = 0; i < lse.numel(); ++i) lse[i] = 1.0f;
  if (!reset_peak_rss()) GTEST_SKIP() << "cannot reset VmHWM here";
  {  // the measurement itself must see a 32 MiB allocation
    const long start = peak_rss_kb();
    std::vector<char> probe(32 << 20, 1);
    EXPECT_GE(peak_rss_kb() - start, 30 * 1024 + probe[12345] - 1);
  }
  ASSERT_TRUE(reset_peak_rss());
  const long before = peak_rss_kb();
  AttentionOptions options;
  options.mask.causal = CausalAlign::top_left;
  options.mask.window = Window{255, 0};
  attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
  const long growth_kb = peak_rss_kb() - before;
  std::printf("peak RSS growth during the N = M = 65536 call: %ld kB\n", growth_kb);
  EXPECT_LT(growth_kb, 16 * 1024);
  EXPECT_TRUE(std::isfinite(out[(N - 1) * D]));
  EXPECT_TRUE(std::isfinite(lse[N - 1]));
}

}  // namespace
}  // namespace qkv
