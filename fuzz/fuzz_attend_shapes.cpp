// libFuzzer target: the shape and mask validation `qkv attend` runs on its .npy inputs, then
// the kernels on whatever passes. It mirrors tools/qkv/cmd_attend.cpp (whose steps live in an
// anonymous namespace there): the rank check and as_rank4 normalization, check_attention_shapes,
// the CLI's own build_mask (tools/qkv/cli_util.cpp, compiled in; the keep-mask and bias are real
// .npy files), the second check with the mask, and the output sizes. Shapes may be absurd (up to
// 2^62 per dimension); a problem small enough to run goes through the fused kernel on a fuzzed
// SIMD path and thread count, the float64 reference and the backward kernel, which must agree.
#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli_mask.h"
#include "cli_util.h"
#include "fuzz_util.h"
#include "qkv/attention.h"
#include "qkv/backward.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace {

using qkv::Tensor;
using qkv::TensorView;

int64_t fuzz_dim(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 0:
      return in.ConsumeIntegralInRange<int64_t>(0, int64_t{1} << 62);  // absurd
    case 1:
      return in.ConsumeIntegralInRange<int64_t>(0, 200);
    default:
      return in.ConsumeIntegralInRange<int64_t>(0, 6);
  }
}

std::vector<int64_t> fuzz_shape(FuzzedDataProvider& in, int rank) {
  std::vector<int64_t> shape(static_cast<std::size_t>(rank));
  for (int64_t& d : shape) d = fuzz_dim(in);
  return shape;
}

// The CLI's normalization: [N, D], [H, N, D] or [B, H, N, D], viewed as rank 4.
std::array<int64_t, 4> as_rank4(const std::vector<int64_t>& shape) {
  std::array<int64_t, 4> out{1, 1, 1, 1};
  std::copy(shape.begin(), shape.end(), out.end() - static_cast<std::ptrdiff_t>(shape.size()));
  return out;
}

std::string int_list(FuzzedDataProvider& in, int64_t count, int64_t limit) {
  std::vector<int64_t> values;
  for (int64_t i = 0; i < count; ++i) values.push_back(in.ConsumeIntegralInRange<int64_t>(-1, limit + 1));
  return fmt::format("{}", fmt::join(values, ","));
}

// A keep-mask or bias file of rank 1-4 whose dims are 1 or the target's (or, rarely, neither).
template <class T>
std::string mask_file(FuzzedDataProvider& in, const std::array<int64_t, 4>& target) {
  const int rank = in.ConsumeIntegralInRange(0, 4);
  std::vector<int64_t> shape(static_cast<std::size_t>(rank));
  int64_t numel = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t want = target[static_cast<std::size_t>(4 - rank + i)];
    const int pick = in.ConsumeIntegralInRange(0, 7);
    shape[static_cast<std::size_t>(i)] = pick == 0 ? in.ConsumeIntegralInRange<int64_t>(0, 5) : pick < 3 ? 1 : want;
    // Checked before multiplying: a target dim may be 2^62 (found by this fuzzer's UBSan build).
    const int64_t d = std::max<int64_t>(shape[static_cast<std::size_t>(i)], 1);
    if (d > 4096 / numel) return {};
    numel *= d;
  }
  Tensor<T> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, uint8_t>) {
      t[i] = in.ConsumeBool() ? 1 : 0;
    } else {
      const int kind = in.ConsumeIntegralInRange(0, 31);
      t[i] = kind == 0 ? -INFINITY : kind == 1 ? NAN : static_cast<float>(in.ConsumeIntegralInRange(-64, 64)) / 16;
    }
  }
  static std::array<qkv::fuzz::ScratchFile, 2> files{qkv::fuzz::ScratchFile("attend_keep"),
                                                     qkv::fuzz::ScratchFile("attend_bias")};
  const std::string& path = files[std::is_same_v<T, uint8_t> ? 0 : 1].path();
  const std::string bytes = qkv::npy_bytes<T>(t.cview());
  qkv::fuzz::write_scratch(path, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return path;
}

std::vector<qkv::Simd> available_paths() {
  std::vector<qkv::Simd> paths;
  for (qkv::Simd s : {qkv::Simd::avx512, qkv::Simd::avx2, qkv::Simd::scalar}) {
    try {
      qkv::simd_path_name(s);
      paths.push_back(s);
    } catch (const qkv::Error&) {
    }
  }
  return paths;
}

Tensor<float> values(FuzzedDataProvider& in, const std::array<int64_t, 4>& shape) {
  Tensor<float> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(in.ConsumeIntegralInRange(-128, 127)) / 32;
  return t;
}

// Runs a problem that passed every check: fused (fuzzed path and threads) against the reference,
// then the backward kernel. Inputs are finite and moderate (|x| <= 4, a bias of -inf or |b| <= 4),
// so every output, lse and gradient must be finite, or exactly the masked-row values.
void run_kernels(FuzzedDataProvider& in, const qkv::AttentionShape& s, qkv::AttentionOptions options) {
  const std::array<int64_t, 4> qs{s.B, s.H, s.N, s.D}, ks{s.B, s.Hkv, s.M, s.D}, vs{s.B, s.Hkv, s.M, s.Dv},
      os{s.B, s.H, s.N, s.Dv};
  const std::array<int64_t, 3> ls{s.B, s.H, s.N};
  Tensor<float> q = values(in, qs), k = values(in, ks), v = values(in, vs), dout = values(in, os);
  static const std::vector<qkv::Simd> paths = available_paths();
  options.simd = paths[in.ConsumeIntegralInRange<std::size_t>(0, paths.size() - 1)];
  options.num_threads = in.ConsumeIntegralInRange(1, 3);
  options.kernel = qkv::Kernel::fused;
  Tensor<float> out(os), lse(ls), ref_out(os), ref_lse(ls);
  qkv::attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
  qkv::AttentionOptions ref_options = options;
  ref_options.kernel = qkv::Kernel::reference;
  qkv::attention_forward(ref_out.view(), ref_lse.view(), q.cview(), k.cview(), v.cview(), ref_options);
  for (int64_t i = 0; i < lse.numel(); ++i) {
    const float a = lse[i], b = ref_lse[i];
    if (std::isnan(a) || std::isnan(b)) qkv::fuzz::invariant_failed("NaN lse for finite inputs");
    if (std::isinf(b) != std::isinf(a) || (std::isinf(b) && a != b))
      qkv::fuzz::invariant_failed("fused and reference disagree on a fully masked row");
    if (!std::isinf(b) && std::abs(a - b) > 1e-4f * (1 + std::abs(b)))
      qkv::fuzz::invariant_failed("fused lse differs from the reference");
  }
  for (int64_t i = 0; i < out.numel(); ++i) {
    const float a = out[i], b = ref_out[i];
    if (std::isnan(a) || std::isnan(b)) qkv::fuzz::invariant_failed("NaN output for finite inputs");
    if (std::abs(a - b) > 1e-4f * (1 + std::abs(b)))
      qkv::fuzz::invariant_failed("fused output differs from the reference");
  }
  Tensor<float> dq(qs), dk(ks), dv(vs);
  qkv::attention_backward(dq.view(), dk.view(), dv.view(), {}, dout.cview(), q.cview(), k.cview(), v.cview(),
                          out.cview(), lse.cview(), options);
  for (const Tensor<float>* g : {&dq, &dk, &dv})
    for (int64_t i = 0; i < g->numel(); ++i)
      if (!std::isfinite((*g)[i])) qkv::fuzz::invariant_failed("a gradient is not finite for finite inputs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  // Ranks: the CLI accepts 2-4 and requires all three equal; anything else is its own message.
  const int rank = in.ConsumeIntegralInRange(2, 4);
  const std::vector<int64_t> q = fuzz_shape(in, rank), k = fuzz_shape(in, rank), v = fuzz_shape(in, rank);
  const std::array<int64_t, 4> q4 = as_rank4(q), k4 = as_rank4(k), v4 = as_rank4(v);
  qkv::AttentionOptions options;
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      options.scale = in.ConsumeFloatingPoint<double>();
      break;
    case 1:
      options.scale = NAN;
      break;
    case 2:
      options.scale = -INFINITY;
      break;
    case 3:
      options.scale = in.ConsumeIntegralInRange(-64, 64) / 8.0;
      break;
    default:
      break;
  }
  qkv::AttentionShape s;
  try {
    s = qkv::check_attention_shapes(q4, k4, v4, options);
  } catch (const qkv::Error&) {
    return 0;
  }
  const std::array<int64_t, 4> target{s.B, s.H, s.N, s.M};
  qkv::cli::MaskArgs args;
  static const char* kAligns[] = {"", "top_left", "bottom_right"};
  args.causal = kAligns[in.ConsumeIntegralInRange(0, 2)];
  args.diagonal = kAligns[in.ConsumeIntegralInRange(1, 2)];
  if (in.ConsumeBool()) args.window = int_list(in, in.ConsumeIntegralInRange(1, 3), 8);
  const int64_t lists = std::min<int64_t>(s.B, 6);
  if (in.ConsumeBool()) args.key_lengths = int_list(in, in.ConsumeBool() ? lists : lists + 1, s.M);
  if (in.ConsumeBool()) args.query_lengths = int_list(in, in.ConsumeBool() ? lists : lists + 1, s.N);
  if (in.ConsumeBool()) {
    std::vector<std::string> slopes;
    for (int64_t h = 0, n = std::min<int64_t>(s.H, 6) + in.ConsumeIntegralInRange(-1, 1); h < n; ++h)
      slopes.push_back(fmt::format("{}", in.ConsumeIntegralInRange(0, 16) / 16.0));
    args.alibi_slopes = fmt::format("{}", fmt::join(slopes, ","));
  }
  if (in.ConsumeBool()) args.softcap = in.ConsumeIntegralInRange(-1, 40) / 2.0;
  if (in.ConsumeBool()) args.keep_mask_path = mask_file<uint8_t>(in, target);
  if (in.ConsumeBool()) args.bias_path = mask_file<float>(in, target);
  try {
    options.mask = qkv::cli::build_mask(args, s.B, s.H, s.N, s.M);
    qkv::check_attention_shapes(q4, k4, v4, options);
    // The CLI's output tensors: sizes that overflow are refused by checked_numel.
    const std::array<int64_t, 4> out4{s.B, s.H, s.N, s.Dv}, weights4{s.B, s.H, s.N, s.M};
    qkv::checked_numel(out4, sizeof(float), "out");
    qkv::checked_numel(weights4, sizeof(double), "weights");
  } catch (const qkv::Error&) {
    return 0;
  }
  const double work = static_cast<double>(s.B) * s.H * s.N * s.M * (s.D + s.Dv) +
                      static_cast<double>(s.B) * (s.H + s.Hkv) * (s.N + s.M) * (s.D + s.Dv);
  // Scales beyond 64 overflow fp32 scores by design (the CLI then refuses the non-finite output).
  if (work <= 2e5 && (!options.scale || std::abs(*options.scale) <= 64)) run_kernels(in, s, options);
  return 0;
}
