// Prints a hash of every output of the forward, the backward and decode on `make bench`'s shapes
// (shapes.h) and decode_bench's caches, from fixed seeds, one line per output and SIMD path. Two
// builds whose lines are identical computed the same bits: a change meant to move code and not
// arithmetic is checked by diffing this program's output before and after it.
//   qkv_checksum [--quick]   (--quick: the shapes up to S3 only, and decode up to 4096 keys)
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/backward.h"
#include "qkv/decode.h"
#include "qkv/kv_cache.h"
#include "shapes.h"

namespace qkv::bench {
namespace {

constexpr int kThreads = 2;  // any count gives the same bits (the test suite checks it)

// FNV-1a over the bytes of the values.
template <class T>
uint64_t hash_of(std::span<const T> values) {
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (std::size_t i = 0; i < values.size_bytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

void print(const std::string& name, const std::vector<float>& values) {
  std::printf("%-40s %016llx\n", name.c_str(),
              static_cast<unsigned long long>(hash_of(std::span<const float>(values))));
  std::fflush(stdout);
}

std::vector<float> normal(std::size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> x(n);
  for (float& e : x) e = dist(rng) * scale;
  return x;
}

std::vector<bf16> to_bf16(const std::vector<float>& f) {
  std::vector<bf16> b(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16(f[i]);
  return b;
}

const char* path_name(Simd simd) {
  switch (simd) {
    case Simd::avx512:
      return "avx512";
    case Simd::avx2:
      return "avx2";
    case Simd::neon:
      return "neon";
    case Simd::scalar:
      return "scalar";
    default:
      return "auto";
  }
}

// The paths this CPU runs (an unavailable one throws).
std::vector<Simd> paths() {
  std::vector<Simd> out;
  for (Simd s : {Simd::avx512, Simd::avx2, Simd::neon, Simd::scalar}) {
    AttentionOptions o;
    o.simd = s;
    o.num_threads = 1;
    std::vector<float> x(4, 1.0f), y(4), l(1);
    const std::array<int64_t, 4> shape{1, 1, 1, 4};
    try {
      attention_forward(TensorView<float>(y.data(), shape), TensorView<float>(l.data(), {1, 1, 1}),
                        TensorView<const float>(x.data(), shape), TensorView<const float>(x.data(), shape),
                        TensorView<const float>(x.data(), shape), o);
      out.push_back(s);
    } catch (const Error&) {
    }
  }
  return out;
}

// The forward (fp32 and bf16 inputs) and the backward of one shape; `masked` adds the masks of the
// masked case (GQA, window, ALiBi, softcap).
void attention_case(const Shape& s, Simd simd, bool masked) {
  const int64_t Hkv = masked && s.H % 2 == 0 ? s.H / 2 : s.H;
  const std::array<int64_t, 4> qs{s.B, s.H, s.N, s.D}, ks{s.B, Hkv, s.N, s.D};
  const std::array<int64_t, 3> ls{s.B, s.H, s.N};
  const std::vector<float> q = normal(static_cast<std::size_t>(s.B * s.H * s.N * s.D), 1, s.q_scale);
  const std::vector<float> k = normal(static_cast<std::size_t>(s.B * Hkv * s.N * s.D), 2);
  const std::vector<float> v = normal(k.size(), 3), dout = normal(q.size(), 4);
  AttentionOptions o;
  o.num_threads = kThreads;
  o.simd = simd;
  if (s.causal) o.mask.causal = CausalAlign::top_left;
  if (masked) {
    o.mask.causal = CausalAlign::bottom_right;
    o.mask.window = Window{s.N / 3, 2};
    o.mask.alibi_slopes.assign(static_cast<std::size_t>(s.H), 0.125f);
    o.mask.softcap = 20.0f;
  }
  const std::string name = std::string(s.name) + (masked ? "+mask" : "") + "/" + path_name(simd);
  std::vector<float> out(q.size()), lse(static_cast<std::size_t>(s.B * s.H * s.N));
  const TensorView<const float> qv(q.data(), qs), kv(k.data(), ks), vv(v.data(), ks);
  attention_forward(TensorView<float>(out.data(), qs), TensorView<float>(lse.data(), ls), qv, kv, vv, o);
  print(name + "/fwd/out", out);
  print(name + "/fwd/lse", lse);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  attention_backward(TensorView<float>(dq.data(), qs), TensorView<float>(dk.data(), ks),
                     TensorView<float>(dv.data(), ks), TensorView<float>(), TensorView<const float>(dout.data(), qs),
                     qv, kv, vv, TensorView<const float>(out.data(), qs), TensorView<const float>(lse.data(), ls), o);
  print(name + "/bwd/dq", dq);
  print(name + "/bwd/dk", dk);
  print(name + "/bwd/dv", dv);
  const std::vector<bf16> qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v);
  std::vector<float> out16(q.size()), lse16(lse.size());
  attention_forward(TensorView<float>(out16.data(), qs), TensorView<float>(lse16.data(), ls),
                    TensorView<const bf16>(qb.data(), qs), TensorView<const bf16>(kb.data(), ks),
                    TensorView<const bf16>(vb.data(), ks), o);
  print(name + "/fwd-bf16/out", out16);
  print(name + "/fwd-bf16/lse", lse16);
}

constexpr int64_t kH = 32, kHkv = 8, kD = 128;

// decode_bench's D1 (one sequence) and D2 (several lengths, small pages); `masked` adds causal,
// window, softcap, sinks and sink tokens with 4 queries per sequence.
void decode_case(const std::string& label, KVDtype dtype, const std::vector<int64_t>& lens, int64_t page_tokens,
                 Simd simd, bool masked) {
  int64_t pages = 0;
  for (int64_t len : lens) pages += (len + page_tokens - 1) / page_tokens;
  KVCache cache(KVCacheConfig{pages, page_tokens, kHkv, kD, kD, dtype});
  std::vector<int64_t> ids;
  uint32_t seed = 10;
  for (int64_t len : lens) {
    const int64_t id = cache.create();
    ids.push_back(id);
    const std::vector<float> k = normal(static_cast<std::size_t>(len * kHkv * kD), seed++);
    const std::vector<float> v = normal(k.size(), seed++);
    cache.append(id, TensorView<const float>(k.data(), {len, kHkv, kD}),
                 TensorView<const float>(v.data(), {len, kHkv, kD}));
  }
  const PagedKV kv = cache.paged(ids);
  const int64_t B = static_cast<int64_t>(lens.size()), N = masked ? 4 : 1;
  const std::array<int64_t, 4> qs{B, kH, N, kD};
  const std::vector<float> q = normal(static_cast<std::size_t>(B * kH * N * kD), 5);
  std::vector<float> out(q.size()), lse(static_cast<std::size_t>(B * kH * N));
  DecodeOptions o;
  o.attention.num_threads = kThreads;
  o.attention.simd = simd;
  if (masked) {
    o.attention.mask.causal = CausalAlign::bottom_right;
    o.attention.mask.window = Window{300, 0};
    o.attention.mask.softcap = 30.0f;
    o.sinks.assign(static_cast<std::size_t>(kH), 0.5f);
    o.sink_tokens = 4;
  }
  decode_attention(TensorView<float>(out.data(), qs), TensorView<float>(lse.data(), {B, kH, N}),
                   TensorView<const float>(q.data(), qs), kv, o);
  const std::string name = label + (masked ? "+mask/" : "/") + kv_dtype_name(dtype) + "/" + path_name(simd);
  print(name + "/out", out);
  print(name + "/lse", lse);
}

}  // namespace
}  // namespace qkv::bench

int main(int argc, char** argv) {
  using namespace qkv;
  using namespace qkv::bench;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::vector<Simd> all = paths();
  for (const Shape& s : kShapes) {
    // The widest path runs every shape; the others the shapes up to S3 (S4-S6 take minutes there).
    const bool small = s.B * s.H * s.N * s.N * s.D <= 12 * 1024 * 1024 * int64_t{64};
    if (quick && !small) continue;
    for (Simd simd : all)
      if (simd == all.front() || small) attention_case(s, simd, false);
    if (small)
      for (Simd simd : all) attention_case(s, simd, true);
  }
  for (KVDtype dtype : {KVDtype::f32, KVDtype::bf16, KVDtype::f16, KVDtype::i8})
    for (Simd simd : all) {
      decode_case("D1-4096", dtype, {4096}, 256, simd, false);
      decode_case("D1-4096", dtype, {4096}, 256, simd, true);
      decode_case("D2", dtype, {1000, 3000, 700, 2048}, 16, simd, false);
      if (!quick && simd == all.front()) decode_case("D1-32768", dtype, {32768}, 256, simd, false);
    }
  return 0;
}
