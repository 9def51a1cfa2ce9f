// Rows whose lse is too large to carry their normalizer: a bias of -2^100 on every allowed key (the
// finfo.min masks of Hugging Face models put -3.4e38 there), where P = exp(logit − lse) came out as
// 1 per key instead of 1/n and the gradients n times too large, and a bias of -4096 with an fp32
// lse, whose rounding (2^-12) put 2.4e-4 of relative error in every P. The scores are exact in
// fp32 here (small multiples of powers of two), so the only error left is the kernels' own
// rounding and the fp32 rule against the float64 oracle holds.
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "qkv/attention.h"
#include "qkv/backward.h"
#include "qkv/reference.h"
#include "test_util.h"

namespace qkv {
namespace {

// Entries ±1/4, ±1/2 or 0 times 2^shift: every score and every score plus bias is exact in fp32.
Tensor<float> coarse(test::Rng& rng, std::initializer_list<int64_t> shape, int shift) {
  Tensor<float> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t[i] = static_cast<float>(std::ldexp(static_cast<double>(rng.uniform_int(-2, 2)), shift - 2));
  return t;
}

TEST(Backward, RowsUnderHugeBiasesGetTheirOwnNormalizer) {
  test::Rng rng("Backward.RowsUnderHugeBiases");
  const int64_t B = 2, H = 2, Hkv = 1, N = 70, M = 150, D = 16, Dv = 24;
  Tensor<float> q = coarse(rng, {B, H, N, D}, 0), k = coarse(rng, {B, Hkv, M, D}, 0);
  Tensor<float> v = rng.normal32({B, Hkv, M, Dv}), dout = rng.normal32({B, H, N, Dv});
  // Rows 4n + 3 of head 1 take q · 2^10 (scores up to ±4096, one-hot rows, the large-score sums)
  // and a bias of +4096, so their lse is past 2^10 in either type: below it an fp32 lse keeps its
  // own rounding, FlashAttention's, whose 2^-14 in P took dk past the rule at q · 2^10.
  for (int64_t i = 3; i < N; i += 4)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t d = 0; d < D; ++d) q.view()(b, 1, i, d) *= 1024.0f;
  Tensor<float> bias({B, H, N, M});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        const double base = i % 4 == 0 ? -0x1p100 : i % 4 == 1 ? -4096.0 : i % 4 == 3 && h == 1 ? 4096.0 : 0.0;
        for (int64_t j = 0; j < M; ++j)
          bias.view()(b, h, i, j) = static_cast<float>(base + std::ldexp(rng.uniform_int(-64, 64), -6));
      }
  Tensor<uint8_t> keep({B, 1, N, M});
  for (int64_t i = 0; i < keep.numel(); ++i) keep[i] = rng.uniform_int(0, 5) != 0;
  AttentionOptions options;
  options.scale = 1.0;
  options.mask.causal = CausalAlign::bottom_right;
  options.mask.key_lengths = {M, 131};
  options.mask.bias = broadcast_mask(bias.cview(), B, H, N, M, "bias");
  options.mask.keep = broadcast_mask(keep.cview(), B, H, N, M, "keep");

  Tensor<double> dq64({B, H, N, D}), dk64({B, Hkv, M, D}), dv64({B, Hkv, M, Dv}), dbias64({B, H, N, M});
  reference_attention_backward(dq64.view(), dk64.view(), dv64.view(), dbias64.view(),
                               to_contiguous<double>(dout.cview()).cview(), to_contiguous<double>(q.cview()).cview(),
                               to_contiguous<double>(k.cview()).cview(), to_contiguous<double>(v.cview()).cview(),
                               options);
  for (Simd simd : test::available_paths())
    for (bool wide : {false, true}) {
      Tensor<float> first[4];
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(std::string(simd_path_name(simd)) + (wide ? ", float64 lse, " : ", fp32 lse, ") +
                     std::to_string(threads) + " threads");
        AttentionOptions o = options;
        o.simd = simd;
        o.num_threads = threads;
        Tensor<float> out({B, H, N, Dv}), lse({B, H, N}), dq({B, H, N, D}), dk({B, Hkv, M, D}), dv({B, Hkv, M, Dv}),
            dbias({B, H, N, M});
        Tensor<double> lse64({B, H, N});
        if (wide) {
          attention_forward_lse64(out.view(), lse64.view(), q.cview(), k.cview(), v.cview(), o);
          attention_backward(dq.view(), dk.view(), dv.view(), dbias.view(), dout.cview(), q.cview(), k.cview(),
                             v.cview(), out.cview(), lse64.cview(), o);
        } else {
          attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), o);
          attention_backward(dq.view(), dk.view(), dv.view(), dbias.view(), dout.cview(), q.cview(), k.cview(),
                             v.cview(), out.cview(), lse.cview(), o);
        }
        EXPECT_TRUE(test::within_fp32_rule(dq.data(), dq64.data(), dq.numel())) << "dq";
        EXPECT_TRUE(test::within_fp32_rule(dk.data(), dk64.data(), dk.numel())) << "dk";
        EXPECT_TRUE(test::within_fp32_rule(dv.data(), dv64.data(), dv.numel())) << "dv";
        EXPECT_TRUE(test::within_fp32_rule(dbias.data(), dbias64.data(), dbias.numel())) << "dbias";
        Tensor<float>* got[4] = {&dq, &dk, &dv, &dbias};
        for (int g = 0; g < 4; ++g) {
          if (threads == 1) {
            first[g] = got[g]->clone();
            continue;
          }
          for (int64_t i = 0; i < got[g]->numel(); ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>((*got[g])[i]), std::bit_cast<uint32_t>(first[g][i]))
                << "gradient " << g << " element " << i << " differs from 1 thread's";
        }
      }
    }
}

}  // namespace
}  // namespace qkv
