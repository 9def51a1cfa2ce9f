// The forward's lse takes log(l) from kernels/row_log.h, several rows per register: it must stay
// within 2 ulp of float64 for every float a row's sum can be, at every width a family uses, and
// give std::log's answer for the inputs outside its range.
#include "kernels/row_log.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qkv::kernels {
namespace {

// |y − log x| in units of the last place of log x, the reference in long double.
double ulps_from_log(double y, float x) {
  const long double ref = std::log(static_cast<long double>(x));
  const double r = static_cast<double>(ref);
  const double ulp = std::nextafter(std::fabs(r), std::numeric_limits<double>::infinity()) - std::fabs(r);
  return static_cast<double>(std::fabs(static_cast<long double>(y) - ref) / ulp);
}

template <int Lanes>
void check_width(test::Rng& rng) {
  // Every finite positive float by its bits (subnormals included), then row sums as the forward
  // makes them: 1 (the max's own weight) up to a long row's.
  std::vector<float> x(100003);  // not a multiple of any width: the last register is partial
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (i % 2 == 0) {
      const uint32_t bits = static_cast<uint32_t>(rng.uniform_int(1, 0x7f7fffff));
      std::memcpy(&x[i], &bits, sizeof bits);
    } else {
      x[i] = 1.0f + static_cast<float>(rng.uniform_int(0, 1 << 24)) / 8.0f;
    }
  }
  x[0] = 1.0f;
  x[1] = std::numeric_limits<float>::max();
  x[2] = std::numeric_limits<float>::denorm_min();
  std::vector<double> y(x.size());
  log_rows<Lanes>(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == 1.0f) {
      ASSERT_EQ(y[i], 0.0) << "log 1 at " << i;
      continue;
    }
    const double u = ulps_from_log(y[i], x[i]);
    worst = std::max(worst, u);
    ASSERT_LE(u, 2.0) << "log(" << x[i] << ") = " << y[i] << " at width " << Lanes;
  }
  std::printf("width %d: worst %.3f ulp over %zu values\n", Lanes, worst, x.size());
}

TEST(RowLog, WithinTwoUlpOfFloat64AtEveryWidth) {
  test::Rng rng("RowLog.WithinTwoUlp");
  check_width<1>(rng);
  check_width<2>(rng);
  check_width<4>(rng);
  check_width<8>(rng);
}

TEST(RowLog, InputsOutsideTheNormalRangeGetStdLogs) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {0.0f, -0.0f, -1.0f, inf, -inf, nan, 2.0f, 0.5f, 3.0f};
  std::vector<double> y(x.size());
  log_rows<8>(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::log(static_cast<double>(x[i]));
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(y[i])) << "log(" << x[i] << ")";
    else if (std::isinf(want))
      EXPECT_EQ(y[i], want) << "log(" << x[i] << ")";
    else
      EXPECT_LE(ulps_from_log(y[i], x[i]), 2.0) << "log(" << x[i] << ")";
  }
}

}  // namespace
}  // namespace qkv::kernels
