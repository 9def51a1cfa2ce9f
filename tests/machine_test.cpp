// The machine measurements' rules and their internal consistency: the cold-cache buffer is sized
// from the L3 found (2x, at least 256 MiB), the class table names the classes the benchmark
// tables are kept per, the read loops sum exactly what they read on any stream and thread count,
// and the probes' summaries (median, spread, best) agree with their own runs. No test here judges
// a speed: on a shared 2-core machine a timing says how busy the machine was. The spreads and
// the hot/cold ratio are printed (and recorded as test properties) for a person to read.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "qkv/attention_options.h"
#include "qkv/decode.h"
#include "qkv/kv_cache.h"
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
  const MachineInfo& m = machine_info();
  EXPECT_EQ(m.l3_bytes, l3);
  if (l3 > 0) {
    EXPECT_FALSE(m.l3_source.empty());
  }
  EXPECT_FALSE(m.class_name.empty());
  std::printf("machine: %s (%s family %d model %d): %s; L3 %lld MiB (%s)\n", m.brand.c_str(), m.vendor.c_str(),
              m.family, m.model, m.class_name.c_str(), static_cast<long long>(l3 >> 20), m.l3_source.c_str());
}

TEST(Machine, ClassNamesTellTheFullAndHalfWidthCoresApart) {
  EXPECT_EQ(machine_class_name("AuthenticAMD", 26, 2, true), "Zen 5 (full-width AVX-512)");
  EXPECT_EQ(machine_class_name("AuthenticAMD", 26, 0x44, true), "Zen 5 (full-width AVX-512)");
  EXPECT_EQ(machine_class_name("AuthenticAMD", 26, 0x24, true), "Zen 5 mobile (double-pumped AVX-512)");
  EXPECT_EQ(machine_class_name("AuthenticAMD", 25, 17, true), "Zen 4 (double-pumped AVX-512)");
  EXPECT_EQ(machine_class_name("AuthenticAMD", 25, 1, false), "Zen 3 (AVX2)");
  EXPECT_EQ(machine_class_name("GenuineIntel", 6, 85, true), "Skylake-SP");
  EXPECT_EQ(machine_class_name("GenuineIntel", 6, 0x8f, true), "Sapphire Rapids");
  EXPECT_EQ(machine_class_name("GenuineIntel", 6, 0x8f, true, true), "Sapphire Rapids");
  EXPECT_EQ(machine_class_name("GenuineIntel", 6, 167, true, true), "Intel Xeon with AMX (family 6 model 167)");
  EXPECT_EQ(machine_class_name("GenuineIntel", 6, 167, true), "GenuineIntel family 6 model 167 (AVX-512)");
  EXPECT_EQ(machine_class_name("HygonGenuine", 24, 1, false), "HygonGenuine family 24 model 1 (no AVX-512)");
}

TEST(Machine, StreamingSumReadsEveryElementOnAnyStreamAndThreadCount) {
  const int64_t n = 64 * 8 * 2 * 3 * 5;  // whole blocks for 1, 2 and 3 threads x 1-8 streams
  std::unique_ptr<float, decltype(&std::free)> buf(static_cast<float*>(std::aligned_alloc(64, n * 4)), &std::free);
  for (int64_t i = 0; i < n; ++i) buf.get()[i] = static_cast<float>(i % 7);
  double want = 0;
  for (int64_t i = 0; i < n; ++i) want += buf.get()[i];
  for (int threads : {1, 2, 3})
    for (int streams : {1, 2, 4, 8})
      EXPECT_EQ(streaming_sum(buf.get(), n, threads, streams), want) << threads << " threads " << streams << " streams";
  test::expect_error([&] { streaming_sum(buf.get(), 64 * 3 + 16, 2); },
                     {"not a multiple of 64 x 1 streams x 2 threads"});
  test::expect_error([&] { streaming_sum(buf.get(), n, 1, 3); }, {"3 streams per thread (1, 2, 4 or 8)"});
  EXPECT_GT(read_bandwidth(2, 1 << 20, 1), 0.0);
  EXPECT_GT(read_bandwidth(3, 1 << 20, 1), 0.0);  // 1 MiB is not whole blocks for 3 threads x 8 streams
}

// The probe's summary is its runs': each count's median, min and max are its passes', the best is
// the highest median, and the bytes are whole blocks of 8 streams per thread.
TEST(Machine, BandwidthProbeSummarizesItsOwnRuns) {
  for (int threads : {1, 2}) {
    const BandwidthProbe p = probe_read_bandwidth(threads, 64 << 20, 5);
    EXPECT_EQ(p.threads, threads);
    EXPECT_EQ(p.bytes % (64 * 8 * threads * 4), 0);
    EXPECT_LE(p.bytes, 64 << 20);
    ASSERT_EQ(p.by_streams.size(), 4u);
    double best = 0;
    int best_streams = 0;
    for (const StreamRates& s : p.by_streams) {
      ASSERT_EQ(s.rates.size(), 5u);
      std::vector<double> sorted = s.rates;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(s.median, sorted[2]);
      EXPECT_EQ(s.min, sorted.front());
      EXPECT_EQ(s.max, sorted.back());
      EXPECT_GT(s.min, 0.0);
      EXPECT_GE(s.spread(), 0.0);
      if (s.median > best) best = s.median, best_streams = s.streams;
      std::printf("%d threads, %d streams: median %.1f GB/s, spread %.0f%% over 5 passes of 64 MiB\n", threads,
                  s.streams, s.median / 1e9, 100 * s.spread());
    }
    EXPECT_EQ(p.best, best);
    EXPECT_EQ(p.best_streams, best_streams);
  }
  test::expect_error([] { probe_read_bandwidth(1, 100, 1); }, {"out of range"});
  // More threads than OpenMP can make crashed (100000); the cap is every attention call's.
  test::expect_error([] { probe_read_bandwidth(kMaxThreads + 1, 1 << 20, 1); }, {"out of range"});
}

TEST(Machine, PeakMeasurementSummarizesItsOwnRuns) {
  for (PeakIsa isa : {PeakIsa::avx512, PeakIsa::avx2, PeakIsa::avx512_bf16, PeakIsa::amx_bf16}) {
    const PeakMeasurement m = measure_peak(1, isa, 3, 0.02);
    if (!peak_isa_available(isa)) {
      EXPECT_TRUE(m.rates.empty());
      EXPECT_EQ(m.best, 0.0);
      continue;
    }
    ASSERT_EQ(m.rates.size(), 3u);
    std::vector<double> sorted = m.rates;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(m.best, sorted[2]);
    EXPECT_EQ(m.median, sorted[1]);
    EXPECT_GT(sorted[0], 0.0);
    std::printf("peak %d: best %.1f GFLOP/s, median %.1f\n", static_cast<int>(isa), m.best / 1e9, m.median / 1e9);
  }
  // The flops counted per step: 16 chains x 16 lanes x 2 (FMA) or 4 (bf16 pair dot product).
  if (peak_isa_available(PeakIsa::avx512)) {
    EXPECT_EQ(fma_peak_work(2, 10, PeakIsa::avx512), 2 * 10 * 16 * 16 * 2.0);
  }
  if (peak_isa_available(PeakIsa::avx512_bf16)) {
    EXPECT_EQ(fma_peak_work(1, 10, PeakIsa::avx512_bf16), 10 * 16 * 16 * 4.0);
  }
  if (peak_isa_available(PeakIsa::avx2)) {
    EXPECT_EQ(fma_peak_work(1, 10, PeakIsa::avx2), 10 * 16 * 12 * 2.0);
  }
  // AMX: four 16 x 16 tile products of 32 bf16 each per step, on every thread.
  if (peak_isa_available(PeakIsa::amx_bf16)) {
    EXPECT_EQ(fma_peak_work(2, 10, PeakIsa::amx_bf16), 2 * 10 * 4 * 16 * 16 * 32 * 2.0);
  } else {
    test::expect_error([] { fma_peak_work(1, 1, PeakIsa::amx_bf16); }, {"this CPU has no AMX-BF16"});
  }
  test::expect_error([] { measure_peak(0, PeakIsa::avx2, 1, 0.1); }, {"out of range"});
  test::expect_error([] { measure_peak(kMaxThreads + 1, PeakIsa::avx2, 1, 0.1); }, {"out of range"});
  test::expect_error([] { fma_peak_work(kMaxThreads + 1, 1, PeakIsa::avx2); }, {"must be in [1, 4096]"});
}

// The bf16 rows' ceiling is the instruction their products run on: AMX only for whole tiles (a head
// dim a multiple of 32, a value dim of 16), and only where the CPU and OS grant it.
TEST(Machine, Bf16ProductsRunOnAmxOnlyForWholeTiles) {
  const PeakIsa tiles = peak_isa_available(PeakIsa::amx_bf16) ? PeakIsa::amx_bf16 : PeakIsa::avx512_bf16;
  std::printf("AMX-BF16 %s\n", tiles == PeakIsa::amx_bf16 ? "granted" : "absent or not granted");
  EXPECT_EQ(bf16_product_isa(64, 64), tiles);
  EXPECT_EQ(bf16_product_isa(128, 16), tiles);
  EXPECT_EQ(bf16_product_isa(40, 64), PeakIsa::avx512_bf16);
  EXPECT_EQ(bf16_product_isa(64, 40), PeakIsa::avx512_bf16);
  EXPECT_EQ(bf16_product_isa(59, 59), PeakIsa::avx512_bf16);
}

// The same decode step, hot (its 8 MiB cache read just before) and cold (memory_probe_bytes()
// read in between): reported, not judged, since a busy neighbour can slow either. Fails only if
// a step throws or the eviction buffer is not the rule's size.
TEST(Machine, ColdEvictionIsTimedBesideTheHotStep) {
  constexpr int64_t kHkv = 8, kH = 32, kD = 128, kM = 1024;  // f32: 8 MiB of K and V
  KVCache cache(KVCacheConfig{1, kM, kHkv, kD, kD, KVDtype::f32});
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  std::vector<float> k(kM * kHkv * kD), v(k.size()), q(kH * kD), out(q.size());
  for (float& x : k) x = normal(gen);
  for (float& x : v) x = normal(gen);
  for (float& x : q) x = normal(gen);
  const int64_t id = cache.create();
  cache.append(id, TensorView<const float>(k.data(), {kM, kHkv, kD}),
               TensorView<const float>(v.data(), {kM, kHkv, kD}));
  const std::vector<int64_t> ids{id};
  const PagedKV kv = cache.paged(ids);
  DecodeOptions o;
  o.attention.num_threads = 1;
  auto step = [&] {
    const auto start = std::chrono::steady_clock::now();
    decode_attention(TensorView<float>(out.data(), {1, kH, 1, kD}), TensorView<float>(),
                     TensorView<const float>(q.data(), {1, kH, 1, kD}), kv, o);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::vector<char> flush(static_cast<std::size_t>(memory_probe_bytes()), 1);
  ASSERT_GE(static_cast<int64_t>(flush.size()), 2 * l3_cache_bytes());
  std::vector<double> hot, cold;
  volatile long sink = 0;
  step();
  for (int r = 0; r < 5; ++r) {
    hot.push_back(step());
    long sum = 0;
    for (std::size_t i = 0; i < flush.size(); i += 64) sum += flush[i];
    sink = sink + sum;
    cold.push_back(step());
  }
  std::sort(hot.begin(), hot.end());
  std::sort(cold.begin(), cold.end());
  const double ratio = cold[2] / hot[2];
  EXPECT_GT(ratio, 0.0);
  ::testing::Test::RecordProperty("cold_over_hot", std::to_string(ratio));
  std::printf("decode step on an 8 MiB cache: hot %.0f us, cold %.0f us (after reading %lld MiB): cold/hot %.2f\n",
              hot[2] * 1e6, cold[2] * 1e6, static_cast<long long>(flush.size() >> 20), ratio);
}

}  // namespace
}  // namespace qkv
