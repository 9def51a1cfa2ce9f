// Random attention problems for the fused-kernel tests: odd shapes (sizes 1-3, 17, 63-65, 1000 and odd head
// dims), every mask kind (alone and combined), GQA, cross-attention and non-contiguous layouts, compared against the
// float64 reference run on the same fp32 values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "qkv/attention.h"
#include "qkv/reference.h"
#include "test_util.h"

namespace qkv::test {

// How a [B, X, L, D] tensor sits in memory.
enum class Layout { contiguous, bnhd, padded };

// One [B, X, L, D] input or output with its own storage, viewed through `view`.
struct Strided {
  Tensor<float> storage;
  TensorView<float> view;
};

inline Strided make_strided(Rng& rng, int64_t B, int64_t X, int64_t L, int64_t D, Layout layout, bool fill) {
  Strided s;
  const std::array<int64_t, 4> shape{B, X, L, D};
  if (layout == Layout::contiguous) {
    s.storage = Tensor<float>(shape);
    s.view = s.storage.view();
  } else if (layout == Layout::bnhd) {  // [B, L, X, D] memory seen as [B, X, L, D]
    s.storage = Tensor<float>({B, L, X, D});
    s.view = s.storage.view().transposed(1, 2);
  } else {  // rows padded by 3 floats, heads by one extra row
    const int64_t row = D + 3, head = (L + 1) * row;
    s.storage = Tensor<float>({B * X * head + 1});
    const std::array<int64_t, 4> strides{X * head, head, row, 1};
    s.view = TensorView<float>(s.storage.data(), shape, strides);
  }
  if (fill) {
    std::normal_distribution<float> dist;
    for (int64_t i = 0; i < s.storage.numel(); ++i) s.storage[i] = dist(rng.engine());
  } else {
    // Sentinels: NaN everywhere, so a row left unwritten (or written into padding) shows up.
    for (int64_t i = 0; i < s.storage.numel(); ++i) s.storage[i] = std::numeric_limits<float>::quiet_NaN();
  }
  return s;
}

// A random problem; `describe` is printed with any failure.
struct Problem {
  AttentionShape shape;
  Strided q, k, v, out;
  Tensor<float> lse;
  Tensor<uint8_t> keep;
  Tensor<float> bias;
  AttentionOptions options;
  std::string describe;
};

// Draws a problem whose reference cost N·M·(D + Dv) stays below `budget`.
inline Problem random_problem(Rng& rng, double budget = 4e6) {
  static const int64_t kLengths[] = {1, 2, 3, 17, 63, 64, 65, 1000};
  static const int64_t kDims[] = {1, 3, 40, 59, 64, 111, 128, 256};
  auto pick = [&](const auto& list) { return list[rng.uniform_int(0, std::size(list) - 1)]; };
  Problem p;
  AttentionShape& s = p.shape;
  for (;;) {
    s.B = rng.uniform_int(1, 2);
    s.Hkv = rng.uniform_int(1, 2);
    s.H = s.Hkv * rng.uniform_int(1, 3);
    s.N = pick(kLengths);
    s.M = rng.uniform_int(0, 2) == 0 ? s.N : pick(kLengths);
    s.D = pick(kDims);
    s.Dv = rng.uniform_int(0, 2) == 0 ? s.D : pick(kDims);
    if (static_cast<double>(s.B * s.H) * s.N * s.M * (s.D + s.Dv) <= budget) break;
  }
  const Layout layouts[] = {Layout::contiguous, Layout::bnhd, Layout::padded};
  auto layout = [&] { return layouts[rng.uniform_int(0, 2)]; };
  p.q = make_strided(rng, s.B, s.H, s.N, s.D, layout(), true);
  p.k = make_strided(rng, s.B, s.Hkv, s.M, s.D, layout(), true);
  p.v = make_strided(rng, s.B, s.Hkv, s.M, s.Dv, layout(), true);
  p.out = make_strided(rng, s.B, s.H, s.N, s.Dv, layout(), false);
  p.lse = Tensor<float>({s.B, s.H, s.N});

  Mask& m = p.options.mask;
  std::string masks;
  const int64_t kinds = rng.uniform_int(0, 255);  // each bit turns one mask kind on
  if (kinds & 1) {
    m.causal = rng.uniform_int(0, 1) ? CausalAlign::bottom_right : CausalAlign::top_left;
    masks += m.causal == CausalAlign::top_left ? " causal-tl" : " causal-br";
  } else if (rng.uniform_int(0, 1)) {
    m.diagonal = CausalAlign::bottom_right;
  }
  if (kinds & 2) {
    m.window = Window{rng.uniform_int(-1, 70), rng.uniform_int(-1, 70)};
    masks += fmt::format(" window({},{})", m.window->left, m.window->right);
  }
  if (kinds & 4) {
    for (int64_t b = 0; b < s.B; ++b) m.key_lengths.push_back(rng.uniform_int(0, s.M));
    masks += fmt::format(" key_lengths({})", fmt::join(m.key_lengths, ","));
  }
  if (kinds & 8) {
    for (int64_t b = 0; b < s.B; ++b) m.query_lengths.push_back(rng.uniform_int(0, s.N));
    masks += fmt::format(" query_lengths({})", fmt::join(m.query_lengths, ","));
  }
  if (kinds & 16) {  // keep-mask broadcast over heads, 80% kept
    p.keep = Tensor<uint8_t>({s.B, 1, s.N, s.M});
    for (int64_t i = 0; i < p.keep.numel(); ++i) p.keep[i] = rng.uniform(0, 1) < 0.8 ? 1 : 0;
    m.keep = broadcast_mask(p.keep.cview(), s.B, s.H, s.N, s.M, "keep");
    masks += " keep";
  }
  if (kinds & 32) {  // bias broadcast over batch, with a few -inf
    p.bias = Tensor<float>({s.H, s.N, s.M});
    for (int64_t i = 0; i < p.bias.numel(); ++i)
      p.bias[i] =
          rng.uniform(0, 1) < 0.05 ? -std::numeric_limits<float>::infinity() : static_cast<float>(rng.uniform(-2, 2));
    m.bias = broadcast_mask(p.bias.cview(), s.B, s.H, s.N, s.M, "bias");
    masks += " bias";
  }
  if (kinds & 64) {
    for (int64_t h = 0; h < s.H; ++h) m.alibi_slopes.push_back(static_cast<float>(rng.uniform(0, 0.5)));
    masks += " alibi";
  }
  if (kinds & 128) {
    m.softcap = static_cast<float>(rng.uniform(0.5, 30));
    masks += fmt::format(" softcap({})", m.softcap);
  }
  if (rng.uniform_int(0, 3) == 0) p.options.scale = rng.uniform(0.01, 1.0);
  p.describe = fmt::format("B={} H={} Hkv={} N={} M={} D={} Dv={} scale={} masks:{}", s.B, s.H, s.Hkv, s.N, s.M, s.D,
                           s.Dv, p.options.scale ? *p.options.scale : -1.0, masks.empty() ? " none" : masks);
  return p;
}

// The float64 reference on the problem's fp32 inputs.
struct Expected {
  Tensor<double> out, lse;
};

inline Expected reference_of(const Problem& p) {
  Tensor<double> q = to_contiguous<double>(TensorView<const float>(p.q.view));
  Tensor<double> k = to_contiguous<double>(TensorView<const float>(p.k.view));
  Tensor<double> v = to_contiguous<double>(TensorView<const float>(p.v.view));
  const AttentionShape& s = p.shape;
  Expected e{Tensor<double>({s.B, s.H, s.N, s.Dv}), Tensor<double>({s.B, s.H, s.N})};
  reference_attention_forward(e.out.view(), e.lse.view(), {}, q.cview(), k.cview(), v.cview(), p.options);
  return e;
}

// Max |out − ref| against the tolerance 2e-5·(1 + max|ref|) (and lse likewise), with masked rows
// required to be exactly 0 and -inf. Returns an empty string on success, else what failed.
inline std::string compare_to_reference(const Problem& p, const Expected& e, double tol_factor = 2e-5) {
  const AttentionShape& s = p.shape;
  double max_ref = 0, max_err = 0, lse_err = 0;
  for (int64_t i = 0; i < e.out.numel(); ++i) max_ref = std::max(max_ref, std::abs(e.out[i]));
  const double tol = tol_factor * (1 + max_ref);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i) {
        const double want_lse = e.lse.view()(b, h, i), got_lse = p.lse.view()(b, h, i);
        if (std::isinf(want_lse)) {
          if (got_lse != want_lse) return fmt::format("row ({},{},{}): lse {} but reference -inf", b, h, i, got_lse);
          for (int64_t d = 0; d < s.Dv; ++d)
            if (p.out.view(b, h, i, d) != 0.0f) return fmt::format("masked row ({},{},{}) not zero", b, h, i);
          continue;
        }
        lse_err = std::max(lse_err, std::abs(got_lse - want_lse) / (1 + std::abs(want_lse)));
        if (!(std::abs(got_lse - want_lse) <= tol * (1 + std::abs(want_lse))))
          return fmt::format("row ({},{},{}): lse {} vs reference {}", b, h, i, got_lse, want_lse);
        for (int64_t d = 0; d < s.Dv; ++d) {
          const double err = std::abs(p.out.view(b, h, i, d) - e.out.view()(b, h, i, d));
          if (!(err <= tol))
            return fmt::format("out({},{},{},{}) = {} vs reference {} (tol {})", b, h, i, d, p.out.view(b, h, i, d),
                               e.out.view()(b, h, i, d), tol);
          max_err = std::max(max_err, err);
        }
      }
  return {};
}

inline void run_fused(Problem& p, Simd simd, int threads) {
  AttentionOptions options = p.options;
  options.kernel = Kernel::fused;
  options.simd = simd;
  options.num_threads = threads;
  attention_forward(p.out.view, p.lse.view(), TensorView<const float>(p.q.view), TensorView<const float>(p.k.view),
                    TensorView<const float>(p.v.view), options);
}

// The SIMD paths this CPU can run (the scalar one always).
inline std::vector<Simd> available_paths() {
  std::vector<Simd> paths;
  for (Simd s : {Simd::avx512, Simd::avx2, Simd::neon, Simd::scalar}) {
    try {
      simd_path_name(s);
      paths.push_back(s);
    } catch (const Error&) {
    }
  }
  return paths;
}

// An upper bound of |score| over the problem: |scale|·max‖q_i‖·max‖k_j‖ (softcapped if set),
// plus max|bias| (finite entries) and max slope · max(N, M) for ALiBi.
inline double score_bound(const test::Problem& p) {
  const AttentionShape& s = p.shape;
  auto max_row_norm = [](TensorView<const float> t) {
    const Tensor<double> c = to_contiguous<double>(t);
    const int64_t d = t.dim(3);
    double m = 0;
    for (int64_t r = 0; r < c.numel() / std::max<int64_t>(d, 1); ++r) {
      double n = 0;
      for (int64_t e = 0; e < d; ++e) n += c[r * d + e] * c[r * d + e];
      m = std::max(m, std::sqrt(n));
    }
    return m;
  };
  const double scale = p.options.scale ? std::abs(*p.options.scale) : 1.0 / std::sqrt(static_cast<double>(s.D));
  double bound =
      scale * max_row_norm(TensorView<const float>(p.q.view)) * max_row_norm(TensorView<const float>(p.k.view));
  const Mask& m = p.options.mask;
  if (m.softcap > 0) bound = std::min<double>(bound, m.softcap);
  double bias = 0;
  for (int64_t i = 0; i < p.bias.numel(); ++i)
    if (std::isfinite(p.bias[i])) bias = std::max(bias, std::abs(static_cast<double>(p.bias[i])));
  double slope = 0;
  for (float x : m.alibi_slopes) slope = std::max(slope, std::abs(static_cast<double>(x)));
  return bound + bias + slope * static_cast<double>(std::max(s.N, s.M));
}

}  // namespace qkv::test
