// detail::sgemm: the layer's and the trainers' matrix products. Against a float64 product on every
// layout, and the same bits for any thread count (its grid of one-thread OpenBLAS calls).
#include "core/blas.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qkv {
namespace {

struct Product {
  bool trans_a, trans_b;
  int64_t m, n, k, pad;  // pad: extra elements at the end of every stored row of a, b and c
  float alpha, beta;
};

// A product's operands, stored as sgemm reads them, and c with NaN in its row gaps.
struct Operands {
  int64_t lda, ldb, ldc;
  std::vector<float> a, b, c;
};

Operands operands(const Product& p, test::Rng& rng) {
  Operands o;
  const int64_t a_rows = p.trans_a ? p.k : p.m, a_cols = p.trans_a ? p.m : p.k;
  const int64_t b_rows = p.trans_b ? p.n : p.k, b_cols = p.trans_b ? p.k : p.n;
  o.lda = a_cols + p.pad, o.ldb = b_cols + p.pad, o.ldc = p.n + p.pad;
  auto fill = [&](std::vector<float>& x, int64_t rows, int64_t cols, int64_t ld) {
    x.assign(static_cast<std::size_t>(rows * ld), std::numeric_limits<float>::quiet_NaN());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        x[static_cast<std::size_t>(r * ld + c)] = static_cast<float>(rng.uniform(-1, 1));
  };
  fill(o.a, a_rows, a_cols, o.lda);
  fill(o.b, b_rows, b_cols, o.ldb);
  fill(o.c, p.m, p.n, o.ldc);
  return o;
}

std::vector<float> run(const Product& p, const Operands& o, int threads) {
  std::vector<float> c = o.c;
  detail::sgemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, o.a.data(), o.lda, o.b.data(), o.ldb, p.beta, c.data(),
                o.ldc, threads);
  return c;
}

// Shapes across the grid's edges (blocks of 128 rows and 256 columns), one block, and thin ones.
std::vector<Product> products() {
  std::vector<Product> all;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      all.push_back({ta, tb, 300, 517, 59, 3, 1.0f, 0.0f});
      all.push_back({ta, tb, 129, 257, 111, 0, 0.5f, 1.0f});
      all.push_back({ta, tb, 1, 3, 40, 1, 1.0f, 0.25f});
      all.push_back({ta, tb, 700, 7, 3, 2, -2.0f, 0.0f});
    }
  return all;
}

// c against the float64 product of p's operands, within the fp32 rule; its row gaps untouched.
void expect_float64_product(const Product& p, const Operands& o, const std::vector<float>& c, uint64_t seed) {
  double err = 0, scale = 0;
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0;
      for (int64_t t = 0; t < p.k; ++t)
        sum += double(p.trans_a ? o.a[t * o.lda + i] : o.a[i * o.lda + t]) *
               double(p.trans_b ? o.b[j * o.ldb + t] : o.b[t * o.ldb + j]);
      const double want = p.alpha * sum + p.beta * double(o.c[i * o.ldc + j]);
      err = std::max(err, std::abs(double(c[i * o.ldc + j]) - want));
      scale = std::max(scale, std::abs(want));
    }
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = p.n; j < o.ldc; ++j) EXPECT_TRUE(std::isnan(c[i * o.ldc + j])) << "gap written";
  EXPECT_LE(err, 2e-5 * (1 + scale)) << p.m << "x" << p.n << "x" << p.k << " trans " << p.trans_a << p.trans_b
                                     << ", seed " << seed;
}

TEST(Blas, ProductsMatchTheFloat64ProductOnEveryLayout) {
  test::Rng rng("Blas.ProductsMatchTheFloat64ProductOnEveryLayout");
  for (const Product& p : products()) {
    const Operands o = operands(p, rng);
    expect_float64_product(p, o, run(p, o, 2), rng.seed());
  }
}

// The products of an address space too small for OpenBLAS: a transposed b packs 2^20 / k of its
// columns per pass (209 at k = 5000, 14 at k = 70000, 1 past k = 2^20), and a long k sums in runs
// (k = 2^20 + 3 in one chain of additions erred 1.5x past the rule).
TEST(Blas, ProductsWithoutOpenBlasMatchTheFloat64ProductOnEveryLayout) {
  test::Rng rng("Blas.ProductsWithoutOpenBlasMatchTheFloat64ProductOnEveryLayout");
  std::vector<Product> all = products();
  all.push_back({false, true, 2, 300, 5000, 1, 1.0f, 0.5f});
  all.push_back({true, true, 3, 20, 70000, 0, 1.0f, 0.0f});
  all.push_back({false, true, 2, 2, (1 << 20) + 3, 0, 1.0f, 0.0f});
  for (const Product& p : all) {
    const Operands o = operands(p, rng);
    std::vector<float> c = o.c;
    detail::sgemm_without_blas(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, o.a.data(), o.lda, o.b.data(), o.ldb,
                               p.beta, c.data(), o.ldc);
    expect_float64_product(p, o, c, rng.seed());
  }
}

TEST(Blas, BitsAreTheSameForAnyThreadCount) {
  test::Rng rng("Blas.BitsAreTheSameForAnyThreadCount");
  for (const Product& p : products()) {
    const Operands o = operands(p, rng);
    const std::vector<float> one = run(p, o, 1);
    for (int threads : {2, 3, 0}) {
      const std::vector<float> c = run(p, o, threads);
      EXPECT_EQ(std::memcmp(one.data(), c.data(), one.size() * sizeof(float)), 0)
          << p.m << "x" << p.n << "x" << p.k << " trans " << p.trans_a << p.trans_b << " at " << threads
          << " threads, seed " << rng.seed();
    }
  }
}

TEST(Blas, EmptyProductsOnlyScaleAndHugeSizesAreRefused) {
  std::vector<float> c = {1, 2, 3, 4};
  const float none = 0;
  detail::sgemm(false, false, 2, 2, 0, 1.0f, &none, 0, &none, 2, 0.5f, c.data(), 2, 2);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  test::expect_error(
      [&] { detail::sgemm(false, false, int64_t{1} << 31, 1, 1, 1, &none, 1, &none, 1, 0, c.data(), 1, 1); },
      {"matrix product: size 2147483648 is outside [0, 2^31 - 1]"});
}

}  // namespace
}  // namespace qkv
