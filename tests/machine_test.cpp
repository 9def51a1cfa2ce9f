// The machine measurements' rules: the read-bandwidth probe is sized from the L3 (2x, at least
// 256 MiB), and its read loop sums exactly what it reads and refuses a length it cannot split.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "qkv/machine.h"
#include "test_util.h"

namespace qkv {
namespace {

TEST(Machine, ProbeIsTwiceTheL3AndAtLeast256MiB) {
  const int64_t l3 = l3_cache_bytes(), probe = memory_probe_bytes();
  EXPECT_GE(l3, 0);
  EXPECT_GE(probe, int64_t{256} << 20);
  EXPECT_GE(probe, 2 * l3);
  EXPECT_EQ(probe, std::max(2 * l3, int64_t{256} << 20));
}

TEST(Machine, StreamingSumReadsEveryElementOnAnyThreadCount) {
  const int64_t n = 64 * 3 * 40;
  std::unique_ptr<float, decltype(&std::free)> buf(static_cast<float*>(std::aligned_alloc(64, n * 4)), &std::free);
  for (int64_t i = 0; i < n; ++i) buf.get()[i] = static_cast<float>(i % 7);
  double want = 0;
  for (int64_t i = 0; i < n; ++i) want += buf.get()[i];
  for (int threads : {1, 2, 3}) EXPECT_EQ(streaming_sum(buf.get(), n, threads), want) << threads;
  test::expect_error([&] { streaming_sum(buf.get(), 64 * 3 + 16, 2); }, {"not a multiple of 64 x 2 threads"});
  EXPECT_GT(read_bandwidth(2, 1 << 20, 1), 0.0);
  EXPECT_GT(read_bandwidth(3, 1 << 20, 1), 0.0);  // 1 MiB is not whole 64-float blocks for 3 threads
}

}  // namespace
}  // namespace qkv
