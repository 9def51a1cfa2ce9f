// Decode problems for the decode tests: a case (storage dtype, GQA, page size, queries, mask,
// sinks), a paged cache filled with random keys and values through shuffled pages and random
// append pieces, the float64 reference on the values as appended, and the two kernels' runs on it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/decode.h"
#include "qkv/kv_cache.h"
#include "test_util.h"

namespace qkv::test {

struct Case {
  KVDtype dtype = KVDtype::f32;
  int64_t Hkv = 1, G = 1, N = 1, D = 16, Dv = 16, page_tokens = 16;
  std::vector<int64_t> lens;
  DecodeOptions options;
};

// A cache holding one sequence per length, whose pages come from the pool in a random order.
struct Filled {
  KVCache cache;
  std::vector<int64_t> ids;
  std::vector<Tensor<float>> k, v;  // the appended values, [len, Hkv, D or Dv]
};

// edit_k, if given, changes each sequence's drawn keys [len, Hkv, D] before they are appended.
inline Filled fill(Rng& rng, const Case& c, double outlier = 0,
                   const std::function<void(Tensor<float>& k)>& edit_k = {}) {
  int64_t pages = 2;
  for (int64_t len : c.lens) pages += (len + c.page_tokens - 1) / c.page_tokens;
  Filled f{KVCache({pages, c.page_tokens, c.Hkv, c.D, c.Dv, c.dtype}), {}, {}, {}};
  // Shuffle the free list: take every page with a one-token sequence, free them in random order.
  std::vector<int64_t> decoys(static_cast<std::size_t>(pages));
  Tensor<float> k1({1, c.Hkv, c.D}), v1({1, c.Hkv, c.Dv});
  for (int64_t& d : decoys) {
    d = f.cache.create();
    f.cache.append(d, k1.cview(), v1.cview());
  }
  std::shuffle(decoys.begin(), decoys.end(), rng.engine());
  for (int64_t d : decoys) f.cache.free(d);
  for (int64_t len : c.lens) {
    f.ids.push_back(f.cache.create());
    f.k.push_back(rng.normal32({len, c.Hkv, c.D}));
    f.v.push_back(rng.normal32({len, c.Hkv, c.Dv}));
    if (outlier > 0)  // one large element per token and head: the int8 step grows with it
      for (int64_t t = 0; t < len * c.Hkv; ++t) {
        f.k.back()[t * c.D + rng.uniform_int(0, c.D - 1)] = static_cast<float>(outlier);
        f.v.back()[t * c.Dv + rng.uniform_int(0, c.Dv - 1)] = static_cast<float>(-outlier);
      }
    if (edit_k) edit_k(f.k.back());
  }
  // Appends in random pieces, interleaved across sequences.
  std::vector<int64_t> done(c.lens.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (std::size_t s = 0; s < c.lens.size(); ++s) {
      const int64_t left = c.lens[s] - done[s];
      if (left == 0) continue;
      const int64_t T = std::min(left, rng.uniform_int(1, 40));
      const float* kp = f.k[s].data() + done[s] * c.Hkv * c.D;
      const float* vp = f.v[s].data() + done[s] * c.Hkv * c.Dv;
      f.cache.append(f.ids[s], TensorView<const float>(kp, {T, c.Hkv, c.D}),
                     TensorView<const float>(vp, {T, c.Hkv, c.Dv}));
      done[s] += T;
      more = true;
    }
  }
  return f;
}

// Float64 attention of q [B,H,N,D] over per-sequence k [Hkv, len, D], v [Hkv, len, Dv] given as
// [len, Hkv, E] (token_major) or [Hkv, len, E], by the formulas of decode.h.
inline void reference(const Case& c, const Tensor<float>& q, const std::vector<Tensor<float>>& k,
                      const std::vector<Tensor<float>>& v, bool token_major, Tensor<double>& out, Tensor<double>& lse) {
  const DecodeOptions& o = c.options;
  const Mask& m = o.attention.mask;
  const int64_t H = c.Hkv * c.G;
  const double scale = o.attention.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.D)));
  for (std::size_t b = 0; b < c.lens.size(); ++b) {
    const int64_t len = c.lens[b];
    auto kat = [&](int64_t g, int64_t j, int64_t d) {
      return token_major ? k[b][(j * c.Hkv + g) * c.D + d] : k[b][(g * len + j) * c.D + d];
    };
    auto vat = [&](int64_t g, int64_t j, int64_t e) {
      return token_major ? v[b][(j * c.Hkv + g) * c.Dv + e] : v[b][(g * len + j) * c.Dv + e];
    };
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < c.N; ++i) {
        const int64_t g = h / c.G, diag = m.causal.has_value() ? i + len - c.N : i;
        std::vector<double> s(static_cast<std::size_t>(len), -INFINITY);
        for (int64_t j = 0; j < len; ++j) {
          bool in = !m.causal.has_value() || j <= diag;
          if (m.window && m.window->left >= 0 && j < diag - m.window->left) in = false;
          if (j < o.sink_tokens && (!m.causal.has_value() || j <= diag)) in = true;
          if (!in) continue;
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d)
            dot += static_cast<double>(q[((b * H + h) * c.N + i) * c.D + d]) * kat(g, j, d);
          double x = dot * scale;
          if (m.softcap > 0) x = m.softcap * std::tanh(x / m.softcap);
          if (!m.alibi_slopes.empty()) x -= m.alibi_slopes[h] * std::fabs(static_cast<double>(j - diag));
          s[j] = x;
        }
        double mx = *std::max_element(s.begin(), s.end());
        double* orow = &out[((b * H + h) * c.N + i) * c.Dv];
        if (mx == -INFINITY) {
          std::fill(orow, orow + c.Dv, 0.0);
          lse[(b * H + h) * c.N + i] = -INFINITY;
          continue;
        }
        const double sink = o.sinks.empty() ? -INFINITY : o.sinks[h];
        mx = std::max(mx, sink);
        double sum = std::exp(sink - mx);
        std::fill(orow, orow + c.Dv, 0.0);
        for (int64_t j = 0; j < len; ++j) {
          const double p = std::exp(s[j] - mx);
          sum += p;
          for (int64_t e = 0; e < c.Dv; ++e) orow[e] += p * vat(g, j, e);
        }
        for (int64_t e = 0; e < c.Dv; ++e) orow[e] /= sum;
        lse[(b * H + h) * c.N + i] = mx + std::log(sum);
      }
  }
}

// max |a - b| over the outputs, and over the finite lse (an lse that is -inf must match exactly).
inline double max_diff(const Tensor<float>& out, const Tensor<double>& ref) {
  double m = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(out[i])) {
      if (out[i] != ref[i]) return INFINITY;
      continue;
    }
    m = std::max(m, std::fabs(out[i] - ref[i]));
  }
  return m;
}

struct Result {
  Tensor<float> out, lse;
};

inline Result run_decode(const Case& c, const Filled& f, const Tensor<float>& q, Simd simd, int threads) {
  const int64_t B = static_cast<int64_t>(c.lens.size()), H = c.Hkv * c.G;
  Result r{Tensor<float>({B, H, c.N, c.Dv}), Tensor<float>({B, H, c.N})};
  DecodeOptions o = c.options;
  o.attention.simd = simd;
  o.attention.num_threads = threads;
  decode_attention(r.out.view(), r.lse.view(), q.cview(), f.cache, f.ids, o);
  return r;
}

// The prefill kernel on the stored keys and values of each sequence, with the sinks applied
// afterwards: out · L / (L + e^sink) = out · 1 / (1 + e^(sink - lse)).
inline Tensor<float> run_prefill(const Case& c, const Filled& f, const Tensor<float>& q) {
  const int64_t B = static_cast<int64_t>(c.lens.size()), H = c.Hkv * c.G;
  Tensor<float> out({B, H, c.N, c.Dv});
  for (int64_t b = 0; b < B; ++b) {
    const Tensor<float> k = f.cache.keys(f.ids[b]), v = f.cache.values(f.ids[b]);
    const int64_t len = c.lens[b];
    AttentionOptions o;
    o.scale = c.options.attention.scale;
    o.mask = c.options.attention.mask;
    const float* qb = q.data() + b * H * c.N * c.D;
    float* ob = out.data() + b * H * c.N * c.Dv;
    Tensor<float> lse({1, H, c.N});
    attention_forward(TensorView<float>(ob, {1, H, c.N, c.Dv}), lse.view(),
                      TensorView<const float>(qb, {1, H, c.N, c.D}),
                      TensorView<const float>(k.data(), {1, c.Hkv, len, c.D}),
                      TensorView<const float>(v.data(), {1, c.Hkv, len, c.Dv}), o);
    if (!c.options.sinks.empty())
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < c.N; ++i) {
          const double factor = 1.0 / (1.0 + std::exp(c.options.sinks[h] - static_cast<double>(lse[h * c.N + i])));
          for (int64_t e = 0; e < c.Dv; ++e) ob[(h * c.N + i) * c.Dv + e] *= static_cast<float>(factor);
        }
  }
  return out;
}

// Case `idx` of a rotation through dtypes, GQA ratios, page sizes, query counts and masks.
inline Case make_case(Rng& rng, int idx) {
  Case c;
  c.dtype = std::array{KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8}[idx % 4];
  c.G = std::array<int64_t, 3>{1, 4, 8}[idx % 3];
  c.Hkv = rng.uniform_int(1, 2);
  c.N = std::array<int64_t, 5>{1, 16, 3, 2, 5}[(idx / 2) % 5];
  c.D = std::array<int64_t, 4>{40, 128, 59, 64}[rng.uniform_int(0, 3)];
  c.Dv = idx % 7 == 0 ? 24 : c.D;
  const int64_t B = 1 + idx % 3;
  for (int64_t b = 0; b < B; ++b) c.lens.push_back(rng.uniform_int(1, 700));
  if (idx % 5 == 0) c.lens[0] = 1;
  const int64_t longest = *std::max_element(c.lens.begin(), c.lens.end());
  c.page_tokens = std::array<int64_t, 4>{16, 64, 5, longest}[rng.uniform_int(0, 3)];  // the last: contiguous
  Mask& m = c.options.attention.mask;
  const int variant = (idx / 4) % 6;  // with idx % 4 for the dtype: every pair in 24 cases
  if (variant >= 1) m.causal = CausalAlign::bottom_right;
  if (variant == 2) m.window = Window{37, -1};
  if (variant == 3) {
    m.softcap = 5.0f;
    for (int64_t h = 0; h < c.Hkv * c.G; ++h) m.alibi_slopes.push_back(static_cast<float>(std::ldexp(1.0, -1 - h % 8)));
  }
  if (variant == 4 || variant == 5)
    for (int64_t h = 0; h < c.Hkv * c.G; ++h) c.options.sinks.push_back(static_cast<float>(rng.uniform(-2, 3)));
  if (variant == 5) {
    m.window = Window{20, -1};
    c.options.sink_tokens = 4;
  }
  return c;
}

inline std::string describe(const Case& c) {
  std::string lens;
  for (int64_t l : c.lens) lens += std::to_string(l) + " ";
  return std::string(kv_dtype_name(c.dtype)) + " Hkv " + std::to_string(c.Hkv) + " G " + std::to_string(c.G) + " N " +
         std::to_string(c.N) + " D " + std::to_string(c.D) + " Dv " + std::to_string(c.Dv) + " page " +
         std::to_string(c.page_tokens) + " lens " + lens + "causal " +
         std::to_string(c.options.attention.mask.causal.has_value()) + " sinks " +
         std::to_string(c.options.sinks.size()) + " sink_tokens " + std::to_string(c.options.sink_tokens);
}

}  // namespace qkv::test
