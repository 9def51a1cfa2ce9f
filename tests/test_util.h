// Helpers shared by the C++ tests: seeded random tensors whose seed is printed, so any failure
// can be replayed with QKV_TEST_SEED=<seed>.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/error.h"
#include "qkv/tensor.h"

namespace qkv::test {

// A generator seeded from QKV_TEST_SEED, or from the clock, mixed with the test's name. The seed
// is recorded in the test's output so a failing case can be replayed.
class Rng {
 public:
  explicit Rng(const std::string& name) {
    uint64_t base = 0;
    if (const char* env = std::getenv("QKV_TEST_SEED"))
      base = std::strtoull(env, nullptr, 10);
    else
      base = static_cast<uint64_t>(std::random_device{}());
    seed_ = base;
    engine_.seed(base ^ std::hash<std::string>{}(name));
    ::testing::Test::RecordProperty("seed", std::to_string(base));
    std::printf("[ seed     ] %s: QKV_TEST_SEED=%llu\n", name.c_str(), static_cast<unsigned long long>(base));
  }
  uint64_t seed() const { return seed_; }
  std::mt19937_64& engine() { return engine_; }
  int64_t uniform_int(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(engine_); }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(engine_); }

  Tensor<double> normal64(std::initializer_list<int64_t> shape) {
    Tensor<double> t(shape);
    std::normal_distribution<double> dist;
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = dist(engine_);
    return t;
  }
  Tensor<float> normal32(std::initializer_list<int64_t> shape) {
    Tensor<float> t(shape);
    std::normal_distribution<float> dist;
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = dist(engine_);
    return t;
  }
  template <class Shape>
  Tensor<float> normal32(const Shape& shape) {
    Tensor<float> t(std::span<const int64_t>(shape.data(), shape.size()));
    std::normal_distribution<float> dist;
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = dist(engine_);
    return t;
  }

 private:
  uint64_t seed_ = 0;
  std::mt19937_64 engine_;
};

// Calls `f`, expecting qkv::Error whose message (one line) contains each of `parts`.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected qkv::Error containing \"" << (parts.empty() ? "" : parts[0]) << "\"";
  } catch (const qkv::Error& e) {
    std::string what = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(what.find(p), std::string::npos) << "message: " << what << "\nmissing: " << p;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "the message should be one line: " << what;
  }
}

// max |x| over the elements of t, in any layout.
template <class T>
double max_abs(TensorView<const T> t) {
  const Tensor<double> c = to_contiguous<double>(t);
  double m = 0;
  for (int64_t i = 0; i < c.numel(); ++i) m = std::max(m, std::abs(c[i]));
  return m;
}
template <class T>
double max_abs(const Tensor<T>& t) {
  return max_abs(t.cview());
}

// The fp32 rule: max|got − ref| within 2e-5·(1 + max|ref|) over n elements; on failure the message
// names the worst element.
inline ::testing::AssertionResult within_fp32_rule(const float* got, const double* ref, int64_t n) {
  double err = 0.0, size = 0.0;
  int64_t worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(e <= err)) err = e, worst = i;
    size = std::max(size, std::fabs(ref[i]));
  }
  const double bound = 2e-5 * (1.0 + size);
  if (err <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << err << " at element " << worst << " (" << got[worst]
                                       << " against " << ref[worst] << "), bound " << bound;
}

}  // namespace qkv::test
