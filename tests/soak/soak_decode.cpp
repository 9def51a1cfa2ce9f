// The decode loop of qkv_soak (soak.cpp): a paged cache of one dtype under random create, append,
// fork and free, decoded every step and checked against a float64 oracle.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "kv_storage_error.h"
#include "soak_util.h"

namespace qkv::soak {
namespace {

using test::storage_error;

constexpr int64_t kHkv = 2, kGroup = 2, kH = kHkv * kGroup, kD = 32, kDv = 24;
constexpr int64_t kNumPages = 160, kMaxLen = 320, kMaxSeqs = 24, kAuditEvery = 1000;

// Page size per dtype, so the loop also covers pages smaller and larger than a typical append.
int64_t page_tokens(KVDtype dtype) {
  switch (dtype) {
    case KVDtype::bf16:
      return 8;
    case KVDtype::f16:
      return 32;
    default:
      return 16;
  }
}

// What was appended to a sequence, before any rounding to the storage dtype: [len, Hkv, D|Dv].
struct Shadow {
  std::vector<float> k, v;
  int64_t len() const { return static_cast<int64_t>(k.size()) / (kHkv * kD); }
};

// A sequence's keys and values as the oracle reads them: token-major (the shadow) or head-major
// (KVCache::keys/values, [Hkv, len, E]).
struct Kv {
  const float* k;
  const float* v;
  int64_t len;
  bool token_major;
  double key(int64_t g, int64_t j, int64_t d) const {
    return token_major ? k[(j * kHkv + g) * kD + d] : k[(g * len + j) * kD + d];
  }
  double value(int64_t g, int64_t j, int64_t e) const {
    return token_major ? v[(j * kHkv + g) * kDv + e] : v[(g * len + j) * kDv + e];
  }
};

// Float64 decode of one batch row: q [H, N, D], causal bottom-right (query i sits at len - N + i),
// scale 1/sqrt(D); out [H, N, Dv], lse [H, N] (a row that sees no key: zeros and -inf).
void oracle(const float* q, int64_t N, const Kv& s, double* out, double* lse) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  std::vector<double> logit(static_cast<std::size_t>(s.len));
  for (int64_t h = 0; h < kH; ++h)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t g = h / kGroup, last = s.len - N + i;
      double* o = out + (h * N + i) * kDv;
      std::fill(o, o + kDv, 0.0);
      if (last < 0) {
        lse[h * N + i] = -INFINITY;
        continue;
      }
      double mx = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < kD; ++d) dot += static_cast<double>(q[(h * N + i) * kD + d]) * s.key(g, j, d);
        logit[j] = dot * scale;
        mx = std::max(mx, logit[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= last; ++j) {
        const double p = std::exp(logit[j] - mx);
        sum += p;
        for (int64_t e = 0; e < kDv; ++e) o[e] += p * s.value(g, j, e);
      }
      for (int64_t e = 0; e < kDv; ++e) o[e] /= sum;
      lse[h * N + i] = mx + std::log(sum);
    }
}

class DecodeSoak {
 public:
  DecodeSoak(KVDtype dtype, uint64_t seed)
      : dtype_(dtype),
        cache_(KVCacheConfig{kNumPages, page_tokens(dtype), kHkv, kD, kDv, dtype}),
        rng_(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(dtype) + 1) {}

  // Fills the whole pool once and frees it, so every page is resident before the first sample.
  void touch_pool() {
    const int64_t id = cache_.create();
    const int64_t T = kNumPages * page_tokens(dtype_);
    std::vector<float> k(static_cast<std::size_t>(T * kHkv * kD), 0.5f),
        v(static_cast<std::size_t>(T * kHkv * kDv), 0.5f);
    cache_.append(id, TensorView<const float>(k.data(), {T, kHkv, kD}),
                  TensorView<const float>(v.data(), {T, kHkv, kDv}));
    cache_.free(id);
  }

  void step() {
    if (leak_per_step > 0) leaked_.push_back(std::make_unique<char[]>(static_cast<std::size_t>(leak_per_step)));
    const int64_t op = uniform(0, 99);
    if (live_.empty() || (op < 6 && size() < kMaxSeqs)) {
      live_[cache_.create()];
    } else if (op < 60) {
      append(pick());
    } else if (op < 68 && size() < kMaxSeqs) {
      const int64_t from = pick();
      live_[cache_.fork(from)] = live_[from];
      ++forks_;
    } else if (op < 76) {
      free(pick());
    }
    decode(false);
  }

  // The page accounting (each page's refcount is the number of live sequences holding it; the
  // free list holds exactly the others) and every stored value against what was appended.
  void audit() {
    std::vector<int32_t> holders(kNumPages, 0);
    for (const auto& [id, s] : live_) {
      if (cache_.length(id) != s.len())
        fail(fmt::format("decode {}: sequence {} has length {}, {} were appended", name(), id, cache_.length(id),
                         s.len()));
      for (const int32_t p : cache_.pages(id)) ++holders[static_cast<std::size_t>(p)];
    }
    int64_t unheld = 0;
    for (int32_t p = 0; p < kNumPages; ++p) {
      unheld += holders[static_cast<std::size_t>(p)] == 0;
      if (cache_.page_refcount(p) != holders[static_cast<std::size_t>(p)])
        fail(fmt::format("decode {}: page {} has refcount {}, {} live sequences hold it", name(), p,
                         cache_.page_refcount(p), holders[static_cast<std::size_t>(p)]));
    }
    if (unheld != cache_.free_pages())
      fail(
          fmt::format("decode {}: {} pages are free, {} are held by no sequence", name(), cache_.free_pages(), unheld));
    for (const auto& [id, s] : live_) {
      check_stored(cache_.keys(id), s.k, kD, id);
      check_stored(cache_.values(id), s.v, kDv, id);
    }
  }

  // Every live sequence decoded against the oracle on the values as appended; frees them all.
  void finish() {
    std::vector<int64_t> ids;
    for (const auto& [id, s] : live_)
      if (s.len() > 0) ids.push_back(id);
    for (std::size_t at = 0; at < ids.size(); at += 4) {
      chosen_.assign(ids.begin() + static_cast<std::ptrdiff_t>(at),
                     ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), at + 4)));
      decode(true);
    }
    while (!live_.empty()) free(live_.begin()->first);
  }

  std::string name() const { return kv_dtype_name(dtype_); }
  int64_t free_pages() const { return cache_.free_pages(); }
  int64_t live_tokens() const {
    int64_t n = 0;
    for (const auto& [id, s] : live_) n += s.len();
    return n;
  }
  std::string counts() const {
    return fmt::format("{} appends ({} tokens), {} forks, {} frees, {} decode calls checked", appends_, tokens_, forks_,
                       frees_, decodes_);
  }
  std::string errors() const {
    return fmt::format(
        "max error vs the oracle on stored values {:.2e} (tolerance 2e-5·(1 + max|ref|)); at the end "
        "vs the values as appended {:.2e}, bound {:.2e}",
        max_err_stored_, max_err_end_, max_bound_end_);
  }

 private:
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  int64_t size() const { return static_cast<int64_t>(live_.size()); }
  int64_t pick() {
    auto it = live_.begin();
    std::advance(it, uniform(0, size() - 1));
    return it->first;
  }

  void free(int64_t id) {
    cache_.free(id);
    live_.erase(id);
    ++frees_;
  }

  // 1 token (a decode step) most of the time, else a prompt-sized piece; int8 gets an outlier
  // token now and then, the case its per-token scale is for.
  void append(int64_t id) {
    const int64_t T = uniform(0, 9) < 7 ? 1 : uniform(2, 48);
    if (live_[id].len() + T > kMaxLen) return free(id);
    const int64_t pt = page_tokens(dtype_), len = live_[id].len();
    const auto pages = cache_.pages(id);
    const int64_t need = (len + T + pt - 1) / pt - static_cast<int64_t>(pages.size()) +
                         (len % pt != 0 && cache_.page_refcount(pages.back()) > 1 ? 1 : 0);
    while (need > cache_.free_pages()) {
      int64_t other = pick();
      if (other == id) continue;
      free(other);
    }
    std::normal_distribution<float> normal;
    std::vector<float> k(static_cast<std::size_t>(T * kHkv * kD)), v(static_cast<std::size_t>(T * kHkv * kDv));
    const float spread = dtype_ == KVDtype::i8 && uniform(0, 19) == 0 ? 40.0f : 1.0f;
    for (float& x : k) x = normal(rng_) * spread;
    for (float& x : v) x = normal(rng_);
    cache_.append(id, TensorView<const float>(k.data(), {T, kHkv, kD}),
                  TensorView<const float>(v.data(), {T, kHkv, kDv}));
    Shadow& s = live_[id];
    s.k.insert(s.k.end(), k.begin(), k.end());
    s.v.insert(s.v.end(), v.begin(), v.end());
    ++appends_;
    tokens_ += T;
  }

  void check_stored(const Tensor<float>& stored, const std::vector<float>& x, int64_t E, int64_t id) {
    const int64_t T = static_cast<int64_t>(x.size()) / (kHkv * E);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < kHkv; ++g) {
        double amax = 0;
        for (int64_t e = 0; e < E; ++e) amax = std::max<double>(amax, std::fabs(x[(t * kHkv + g) * E + e]));
        for (int64_t e = 0; e < E; ++e) {
          const double want = x[(t * kHkv + g) * E + e], got = stored[(g * T + t) * E + e];
          if (std::fabs(got - want) > storage_error(dtype_, want, amax)) {
            fail(fmt::format(
                "decode {}: sequence {} ({}) token {} head {} element {} holds {} where {} was appended "
                "(max |x| of the token {}, allowed error {})",
                name(), id, E == kD ? "keys" : "values", t, g, e, got, want, amax, storage_error(dtype_, want, amax)));
            return;
          }
        }
      }
  }

  // Decodes `chosen_` (or 1-4 random non-empty live sequences) and checks it: against the oracle
  // on the stored values, or at the end on the values as appended within the quantization bound
  // of Decode.Int8WithinTheBoundOfItsQuantizationStep (zero extra for f32).
  void decode(bool at_end) {
    if (!at_end) {
      std::vector<int64_t> nonempty;
      for (const auto& [id, s] : live_)
        if (s.len() > 0) nonempty.push_back(id);
      if (nonempty.empty()) return;
      std::shuffle(nonempty.begin(), nonempty.end(), rng_);
      nonempty.resize(
          static_cast<std::size_t>(std::min<int64_t>(uniform(1, 4), static_cast<int64_t>(nonempty.size()))));
      chosen_ = nonempty;
    }
    const auto B = static_cast<int64_t>(chosen_.size());
    const int64_t N = uniform(1, 3);
    Tensor<float> q({B, kH, N, kD}), out({B, kH, N, kDv}), lse({B, kH, N});
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < q.numel(); ++i) q[i] = normal(rng_);
    DecodeOptions options;
    options.attention.mask.causal = CausalAlign::bottom_right;
    options.attention.num_threads = 1;  // other threads' spin-waits on a loaded machine would only cost time
    decode_attention(out.view(), lse.view(), q.cview(), cache_, chosen_, options);
    ++decodes_;
    std::vector<double> ref(static_cast<std::size_t>(kH * N * kDv)), ref_lse(static_cast<std::size_t>(kH * N));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t id = chosen_[static_cast<std::size_t>(b)];
      const Shadow& s = live_.at(id);
      const Tensor<float> ks = cache_.keys(id), vs = cache_.values(id);
      const Kv stored{ks.data(), vs.data(), s.len(), false}, appended{s.k.data(), s.v.data(), s.len(), true};
      const float* qb = &q[b * kH * N * kD];
      oracle(qb, N, at_end ? appended : stored, ref.data(), ref_lse.data());
      double amax = 0, err = 0;
      for (const double r : ref) amax = std::max(amax, std::fabs(r));
      for (int64_t i = 0; i < kH * N * kDv; ++i) err = std::max(err, std::fabs(out[b * kH * N * kDv + i] - ref[i]));
      double bound = 2e-5 * (1 + amax);
      if (at_end) {
        bound += quantization_bound(qb, N, stored, appended);
        max_err_end_ = std::max(max_err_end_, err);
        max_bound_end_ = std::max(max_bound_end_, bound);
      } else {
        max_err_stored_ = std::max(max_err_stored_, err);
        for (int64_t i = 0; i < kH * N; ++i) {
          const double want = ref_lse[i], got = lse[b * kH * N + i];
          if (!(got == want || std::fabs(got - want) <= 2e-5 * (1 + std::fabs(want))))
            fail(fmt::format("decode {}: lse {} of sequence {} is {}, the oracle says {}", name(), i, id, got, want));
        }
      }
      if (!(err <= bound))
        fail(fmt::format("decode {}: sequence {} (length {}, N {}) is {:.3g} from the oracle{}, above {:.3g}", name(),
                         id, s.len(), N, err, at_end ? " on the values as appended" : "", bound));
    }
  }

  // eps + (e^{2Δ} - 1)·max|v|: Δ the largest logit shift the stored keys cause, eps the largest
  // stored-value error (decode_test.cpp derives it).
  static double quantization_bound(const float* q, int64_t N, const Kv& stored, const Kv& appended) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
    double delta = 0, eps = 0, vmax = 0;
    for (int64_t g = 0; g < kHkv; ++g)
      for (int64_t j = 0; j < stored.len; ++j) {
        for (int64_t e = 0; e < kDv; ++e) {
          vmax = std::max(vmax, std::fabs(appended.value(g, j, e)));
          eps = std::max(eps, std::fabs(stored.value(g, j, e) - appended.value(g, j, e)));
        }
        for (int64_t h = g * kGroup; h < (g + 1) * kGroup; ++h)
          for (int64_t i = 0; i < N; ++i) {
            double dot = 0;
            for (int64_t d = 0; d < kD; ++d)
              dot += static_cast<double>(q[(h * N + i) * kD + d]) * (stored.key(g, j, d) - appended.key(g, j, d));
            delta = std::max(delta, scale * std::fabs(dot));
          }
      }
    return eps + std::expm1(2 * delta) * vmax;
  }

  KVDtype dtype_;
  KVCache cache_;
  std::mt19937_64 rng_;
  std::map<int64_t, Shadow> live_;
  std::vector<int64_t> chosen_;
  std::vector<std::unique_ptr<char[]>> leaked_;
  int64_t appends_ = 0, tokens_ = 0, forks_ = 0, frees_ = 0, decodes_ = 0;
  double max_err_stored_ = 0, max_err_end_ = 0, max_bound_end_ = 0;
};

}  // namespace

void soak_decode(KVDtype dtype, int64_t steps, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  Memory mem;
  DecodeSoak soak(dtype, seed);
  const std::string loop = "decode " + soak.name();
  soak.touch_pool();
  const int64_t warm = warm_up_steps(steps);
  int64_t free_warm = 0, tokens_warm = 0;
  // After warm-up and at the end: audit, decode every live sequence against the oracle on the
  // values as appended, free them all, and sample memory with nothing live.
  auto settle = [&](int64_t& free_pages, int64_t& tokens) {
    soak.audit();
    free_pages = soak.free_pages(), tokens = soak.live_tokens();
    soak.finish();
    if (soak.free_pages() != kNumPages)
      fail(fmt::format("{}: {} of {} pages free after freeing every sequence", loop, soak.free_pages(), kNumPages));
  };
  for (int64_t step = 0; step < steps; ++step) {
    mem.sample(step);
    if (step == warm) {
      settle(free_warm, tokens_warm);
      mem.warm();
    }
    soak.step();
    if ((step + 1) % kAuditEvery == 0) soak.audit();
  }
  if (steps <= warm) mem.warm();
  int64_t free_end = 0, tokens_end = 0;
  settle(free_end, tokens_end);
  mem.end(loop);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "%s: %lld steps, %s; %s; before freeing all: %lld pages free (%lld tokens live) after warm-up, %lld (%lld "
      "tokens) at the end; %lld/%lld free after freeing all; %s; %.1f s\n",
      loop.c_str(), static_cast<long long>(steps), soak.counts().c_str(), soak.errors().c_str(),
      static_cast<long long>(free_warm), static_cast<long long>(tokens_warm), static_cast<long long>(free_end),
      static_cast<long long>(tokens_end), static_cast<long long>(soak.free_pages()), static_cast<long long>(kNumPages),
      mem.describe().c_str(), secs);
  std::fflush(stdout);
}

void prime_decode() {
  DecodeSoak soak(KVDtype::i8, 0);
  for (int i = 0; i < 50; ++i) soak.step();
  soak.finish();
}

}  // namespace qkv::soak
