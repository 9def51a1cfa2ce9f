// Resource limits and the numeric edge rows of the bad-input table (docs/bad-inputs.md): files whose
// declared sizes exceed what can be allocated are refused with an Error naming the file, before
// any allocation is touched; shapes that overflow size_t are refused; denormal, huge, empty and
// fully masked inputs give the documented results on every SIMD path.
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "capped_memory.h"
#include "io_test_util.h"
#include "qkv/attention.h"
#include "qkv/backward.h"
#include "qkv/reference.h"
#include "qkv/embeddings.h"
#include "qkv/io.h"
#include "qkv/out_of_memory.h"
#include "qkv/weights.h"
#include "test_util.h"

#ifdef QKV_TEST_UNDER_ASAN
// ASan aborts on an allocation above 1 TB unless told to return null like malloc does; the code
// under test handles a null allocation, which is what these tests exercise.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif

namespace qkv {
namespace {

constexpr uint64_t kTwoTB = uint64_t{2} << 40;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "qkv_limits_" + std::to_string(::getpid()) + "_" + name;
}

// Writes `head` and extends the file (sparsely: no disk is used) to `total` bytes.
void write_sparse(const std::string& path, const std::string& head, uint64_t total) {
  {
    std::ofstream f(path, std::ios::binary);
    f.write(head.data(), static_cast<std::streamsize>(head.size()));
  }
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(total)), 0) << path;
}

template <class F>
void expect_refused_in_child(F load, uint64_t cap, const std::string& path, const std::string& pattern) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(test::load_with_capped_memory(load, cap, path), ::testing::ExitedWithCode(0), pattern);
}

TEST(Limits, TinyNpyDeclaring2TBIsRefusedBeforeAllocating) {
  const std::string path = temp_path("tiny2tb.npy");
  const std::string bytes = test::npy_header("<f4", "(524288, 1048576)") + std::string(16, '\0');  // 2^39 floats
  std::ofstream(path, std::ios::binary) << bytes;
  try {
    load_npy<float>(path);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("declares 2199023255552 bytes but the file holds 16"), std::string::npos)
        << e.what();
  }
  std::remove(path.c_str());
}

// A file that really is 2 TB long (sparse) and consistent with its header: only the memory check
// (or a refused allocation) stands between it and the machine.
TEST(Limits, SparseNpyOf2TBIsRefusedWithAClearError) {
  const std::string path = temp_path("sparse2tb.npy");
  const std::string head = test::npy_header("<f4", "(524288, 1048576)");
  write_sparse(path, head, head.size() + kTwoTB);
  expect_refused_in_child([&] { load_npy<float>(path); }, 3 * kTwoTB, path,
                          "qkv_limits_.*sparse2tb.npy.*(allocate|memory)");
  std::remove(path.c_str());
}

TEST(Limits, SparseSafetensorsTensorOf2TBIsRefusedWithAClearError) {
  const std::string path = temp_path("sparse2tb.safetensors");
  std::string json = R"({"w":{"dtype":"F32","shape":[524288,1048576],"data_offsets":[0,2199023255552]}})";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) head[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  head += json;
  write_sparse(path, head, head.size() + kTwoTB);
  expect_refused_in_child([&] { load_safetensors(path); }, 3 * kTwoTB, path,
                          "qkv_limits_.*sparse2tb.safetensors.*(allocate|memory)");
  std::remove(path.c_str());
}

TEST(Limits, Word2vecHeaderClaiming10To12WordsIsRefused) {
  const std::string text = temp_path("w2v_text.txt"), binary = temp_path("w2v_binary.bin");
  std::ofstream(text) << "1000000000000 3\nbank 0.1 0.2 0.3\n";
  const float v[3] = {0.1f, 0.2f, 0.3f};
  {
    std::ofstream f(binary, std::ios::binary);
    f << "1000000000000 3\nbank ";
    f.write(reinterpret_cast<const char*>(v), sizeof v);
  }
  for (const auto& [path, format, needle] :
       {std::tuple{text, EmbeddingFormat::word2vec_text, "declares 1000000000000 words"},
        std::tuple{binary, EmbeddingFormat::word2vec_binary, "declares 1000000000000 words of 3 floats"},
        std::tuple{binary, EmbeddingFormat::automatic, "declares 1000000000000 words of 3 floats"}}) {
    try {
      Embeddings::load(path, format);
      ADD_FAILURE() << path << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  std::remove(text.c_str());
  std::remove(binary.c_str());
}

// One word whose vector is 2^39 floats (2 TB), in a sparse file that really holds them.
TEST(Limits, SparseWord2vecBinaryVectorOf2TBIsRefusedWithAClearError) {
  const std::string path = temp_path("sparse2tb.bin");
  const std::string head = "1 549755813888\nw ";
  write_sparse(path, head, head.size() + kTwoTB);
  expect_refused_in_child([&] { Embeddings::load(path, EmbeddingFormat::word2vec_binary); }, 3 * kTwoTB, path,
                          "qkv_limits_.*sparse2tb.bin.*(allocate|memory)");
  std::remove(path.c_str());
}

TEST(Limits, ShapesThatOverflowSizeTAreRefused) {
  auto expect_error = [](auto make, const std::string& needle) {
    try {
      make();
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(
      [] {
        Tensor<float>({int64_t{1} << 40, int64_t{1} << 40}, "huge");
      },
      "huge: shape [1099511627776, 1099511627776] is too large to address");
  expect_error([] { Tensor<double>({int64_t{1} << 60}, "big"); }, "big: shape [1152921504606846976] is too large");
  expect_error([] { Tensor<float>({3, -1}, "neg"); }, "neg: negative dimension in shape [3, -1]");
  const std::array<int64_t, 4> shape{int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31, 2};
  expect_error([&] { checked_numel(shape, 1, "q"); }, "q: shape");
  // An empty dimension makes the product 0 however large the others are.
  const std::array<int64_t, 3> empty{0, int64_t{1} << 62, int64_t{1} << 62};
  EXPECT_EQ(checked_numel(empty, 4, "empty"), 0);
}

// Per-path helpers: the float64 reference result of q, k, v as floats.
struct Result {
  Tensor<float> out, lse;
};
Result run(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v, AttentionOptions options) {
  Result r{Tensor<float>({q.dim(0), q.dim(1), q.dim(2), v.dim(3)}), Tensor<float>({q.dim(0), q.dim(1), q.dim(2)})};
  attention_forward(r.out.view(), r.lse.view(), q.cview(), k.cview(), v.cview(), options);
  return r;
}

// Every fused path against the float64 reference on the same inputs, within `tol` relative (to
// 1 + max|out| for the outputs, to 1 + |lse| for each lse).
void expect_paths_match_reference(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                  const std::string& what, AttentionOptions options = {}, double tol = 2e-5) {
  options.kernel = Kernel::reference;
  const Result want = run(q, k, v, options);
  options.kernel = Kernel::fused;
  for (Simd simd : test::available_paths()) {
    options.simd = simd;
    const Result got = run(q, k, v, options);
    // Relative to the largest output, as the fused kernel's contract reads: an output that is a
    // near-cancelling sum of values ~1e30 (8.8e26 on QKV_TEST_SEED=3852703157) carries error of
    // the values' size, not its own.
    double max_out = 0;
    for (int64_t i = 0; i < want.out.numel(); ++i) max_out = std::max(max_out, std::abs(double{want.out[i]}));
    for (int64_t i = 0; i < want.out.numel(); ++i)
      ASSERT_NEAR(got.out[i], want.out[i], tol * (1 + max_out))
          << what << " " << simd_path_name(simd) << " out[" << i << "]";
    for (int64_t i = 0; i < want.lse.numel(); ++i) {
      if (std::isinf(want.lse[i])) {
        ASSERT_EQ(got.lse[i], want.lse[i]) << what << " " << simd_path_name(simd) << " lse[" << i << "]";
      } else {
        ASSERT_NEAR(got.lse[i], want.lse[i], tol * (1 + std::abs(want.lse[i])))
            << what << " " << simd_path_name(simd) << " lse[" << i << "]";
      }
    }
  }
}

TEST(Limits, DenormalInputsGiveTheReferenceResultOnEveryPath) {
  test::Rng rng("Limits.Denormals");
  Tensor<float> q = rng.normal32({1, 2, 5, 7}), k = rng.normal32({1, 2, 9, 7}), v = rng.normal32({1, 2, 9, 3});
  // q and k subnormal (scores underflow to 0: uniform weights), v subnormal (outputs subnormal).
  for (int64_t i = 0; i < q.numel(); ++i) q[i] *= 1e-39f;
  for (int64_t i = 0; i < k.numel(); ++i) k[i] *= 1e-39f;
  ASSERT_TRUE(std::fpclassify(q[0]) == FP_SUBNORMAL);
  expect_paths_match_reference(q, k, v, "subnormal q, k");
  for (int64_t i = 0; i < v.numel(); ++i) v[i] *= 1e-40f;
  // Outputs are ~1e-40. The kernels run with flush-to-zero (src/kernels/flush_subnormals.h:
  // subnormal results cost x86 a microcode assist each, which made scores ~150 apart 9x slower),
  // so an output below FLT_MIN may come out as 0: the contract is FLT_MIN absolute, no more.
  expect_paths_match_reference(q, k, v, "subnormal q, k, v", {}, std::numeric_limits<float>::min());
}

#if defined(__x86_64__)
// The flush-to-zero mode is the kernels' own: a caller's mode, either way, is what it gets back,
// after the forward and the backward alike (1 and 2 threads).
TEST(Limits, TheCallersFlushToZeroModeIsKept) {
  test::Rng rng("Limits.FlushToZeroMode");
  Tensor<float> q = rng.normal32({1, 2, 70, 8}), k = rng.normal32({1, 2, 70, 8}), v = rng.normal32({1, 2, 70, 8});
  Tensor<float> out({1, 2, 70, 8}), lse({1, 2, 70}), dq({1, 2, 70, 8}), dk({1, 2, 70, 8}), dv({1, 2, 70, 8});
  for (unsigned mode : {_MM_FLUSH_ZERO_OFF, _MM_FLUSH_ZERO_ON})
    for (int threads : {1, 2}) {
      _MM_SET_FLUSH_ZERO_MODE(mode);
      AttentionOptions options;
      options.num_threads = threads;
      attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
      EXPECT_EQ(_MM_GET_FLUSH_ZERO_MODE(), mode) << "after the forward, " << threads << " threads";
      attention_backward(dq.view(), dk.view(), dv.view(), {}, out.cview(), q.cview(), k.cview(), v.cview(), out.cview(),
                         lse.cview(), options);
      EXPECT_EQ(_MM_GET_FLUSH_ZERO_MODE(), mode) << "after the backward, " << threads << " threads";
    }
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_OFF);
}
#endif

TEST(Limits, HugeValuesInVGiveTheReferenceResultOnEveryPath) {
  test::Rng rng("Limits.HugeV");
  Tensor<float> q = rng.normal32({1, 1, 6, 5}), k = rng.normal32({1, 1, 8, 5}), v = rng.normal32({1, 1, 8, 4});
  for (int64_t i = 0; i < v.numel(); ++i) v[i] *= 1e30f;
  expect_paths_match_reference(q, k, v, "v ~ 1e30");
}

// Scores up to 1e12 are finite in fp32 (q·k of entries ~1e6); the softmax is then one-hot and
// the output is the value of the best key. The SIMD paths once folded the row max into one FMA
// with log2(e) and got this wrong above ~2e9.
TEST(Limits, LargeFiniteScoresGiveTheReferenceResultOnEveryPath) {
  for (float x : {3e4f, 1e5f, 1e6f}) {
    Tensor<float> q({1, 1, 1, 1}), k({1, 1, 2, 1}), v({1, 1, 2, 1});
    q[0] = x;
    k[0] = x;
    k[1] = 0;
    v[0] = 1;
    v[1] = 2;
    AttentionOptions options;
    options.scale = 1.0;
    expect_paths_match_reference(q, k, v, "score " + std::to_string(double{x} * x), options);
  }
}

// Unmasked key blocks take the scale after the block's max when scale > 0 (max(s)·scale, then
// s·scale − m in one FMA: forward_tile.h), and scale it first otherwise: every sign and size of
// scale gives the reference's out and lse. 300 keys: several blocks, the last one partial.
TEST(Limits, EveryScaleSignMatchesTheReferenceOnUnmaskedBlocks) {
  test::Rng rng("Limits.EveryScaleSign");
  const Tensor<float> q = rng.normal32({1, 2, 37, 16}), k = rng.normal32({1, 2, 300, 16}),
                      v = rng.normal32({1, 2, 300, 16});
  for (double scale : {0.25, -0.75, 0.0, -3.0, 1e-30}) {
    AttentionOptions options;
    options.scale = scale;
    expect_paths_match_reference(q, k, v, "scale " + std::to_string(scale), options);
  }
}

// A scale <= 0 is legal (only finiteness is required). Found by fuzz_attend_shapes: the backward
// once masked out-of-band scores to -inf before multiplying by the scale, giving NaN gradients.
TEST(Limits, NonPositiveScaleWithCausalMaskGivesTheReferenceGradients) {
  test::Rng rng("Limits.NegativeScaleBackward");
  const int64_t N = 4, M = 5, D = 5;
  const Tensor<float> q = rng.normal32({1, 1, N, D}), k = rng.normal32({1, 1, M, D}), v = rng.normal32({1, 1, M, D});
  const Tensor<float> dout = rng.normal32({1, 1, N, D});
  for (double scale : {-0.75, 0.0}) {
    AttentionOptions options;
    options.scale = scale;
    options.mask.causal = CausalAlign::top_left;
    Tensor<double> rq({1, 1, N, D}), rk({1, 1, M, D}), rv({1, 1, M, D});
    const Tensor<double> q64 = to_contiguous<double>(q.cview()), k64 = to_contiguous<double>(k.cview());
    const Tensor<double> v64 = to_contiguous<double>(v.cview()), d64 = to_contiguous<double>(dout.cview());
    reference_attention_backward(rq.view(), rk.view(), rv.view(), {}, d64.cview(), q64.cview(), k64.cview(),
                                 v64.cview(), options);
    for (Simd simd : test::available_paths()) {
      options.simd = simd;
      Tensor<float> out({1, 1, N, D}), lse({1, 1, N}), dq({1, 1, N, D}), dk({1, 1, M, D}), dv({1, 1, M, D});
      attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), options);
      attention_backward(dq.view(), dk.view(), dv.view(), {}, dout.cview(), q.cview(), k.cview(), v.cview(),
                         out.cview(), lse.cview(), options);
      for (const auto& [got, want] : {std::pair{&dq, &rq}, std::pair{&dk, &rk}, std::pair{&dv, &rv}})
        for (int64_t i = 0; i < got->numel(); ++i)
          ASSERT_NEAR((*got)[i], (*want)[i], 1e-4 * (1 + std::abs((*want)[i])))
              << "scale " << scale << " " << simd_path_name(simd) << " [" << i << "]";
    }
  }
}

TEST(Limits, ScoresThatOverflowFloat32AreRefusedNotReturned) {
  // Row 0: q·k ~ 1e39 overflows fp32; the fused kernels returned that row as inf/NaN and now refuse
  // the call (FusedForward.RefusesAnOverflowFromFiniteInputs). The float64 reference computes
  // row 0, but its lse (~1e39) is past fp32: it was returned as +inf, and is now refused unless
  // asked for in float64; row 1 (q·k ~ 1) is unaffected.
  Tensor<float> q({1, 1, 2, 2}), k({1, 1, 3, 2}), v({1, 1, 3, 2});
  q[0] = q[1] = 1e30f;
  q[2] = q[3] = 5e-10f;
  for (int64_t i = 0; i < 6; ++i) k[i] = static_cast<float>(i + 1) * 1e9f;
  for (int64_t i = 0; i < 6; ++i) v[i] = static_cast<float>(i);
  AttentionOptions options;
  options.kernel = Kernel::reference;
  test::expect_error([&] { run(q, k, v, options); },
                     {"attention_forward: lse = 7.78e+39 is finite but past float32's range (3.4e38); ask for it in "
                      "float64 (attention_forward_lse64"});
  Result want{Tensor<float>({1, 1, 2, 2}), Tensor<float>({1, 1, 2})};
  Tensor<double> lse64({1, 1, 2});
  attention_forward_lse64(want.out.view(), lse64.view(), q.cview(), k.cview(), v.cview(), options);
  EXPECT_NEAR(lse64[0], 7.778e39, 1e36);
  want.lse[1] = static_cast<float>(lse64[1]);
  EXPECT_EQ(lse_to_float32(3.4e38), 3.4e38f);
  EXPECT_EQ(lse_to_float32(std::numeric_limits<double>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(lse_to_float32(-std::numeric_limits<double>::infinity()), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(lse_to_float32(std::nan(""))));
  test::expect_error([] { lse_to_float32(-1e39); }, {"lse = -1e+39 is finite but past float32's range"});
  options.kernel = Kernel::fused;
  for (Simd simd : test::available_paths()) {
    options.simd = simd;
    try {
      run(q, k, v, options);
      ADD_FAILURE() << simd_path_name(simd) << ": the overflow was returned";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("overflowed float32"), std::string::npos) << e.what();
    }
    // Row 1 alone is within range: computed as before.
    Tensor<float> q1({1, 1, 1, 2});
    q1[0] = q1[1] = 5e-10f;
    const Result got = run(q1, k, v, options);
    EXPECT_NEAR(got.lse[0], want.lse[1], 2e-5 * (1 + std::abs(want.lse[1]))) << simd_path_name(simd);
    for (int64_t e = 0; e < 2; ++e) EXPECT_NEAR(got.out[e], want.out[2 + e], 1e-5) << simd_path_name(simd);
  }
}

TEST(Limits, EmptyQueriesOrKeysOnEveryPath) {
  test::Rng rng("Limits.Empty");
  Tensor<float> q = rng.normal32({2, 1, 4, 3}), k = rng.normal32({2, 1, 5, 3}), v = rng.normal32({2, 1, 5, 2});
  Tensor<float> q0({2, 1, 0, 3}), k0({2, 1, 0, 3}), v0({2, 1, 0, 2});
  AttentionOptions options;
  options.kernel = Kernel::fused;
  for (Simd simd : test::available_paths()) {
    options.simd = simd;
    const Result none = run(q0, k, v, options);  // N = 0: nothing to compute, nothing written
    EXPECT_EQ(none.out.numel(), 0);
    const Result masked = run(q, k0, v0, options);  // M = 0: every row fully masked
    for (int64_t i = 0; i < masked.out.numel(); ++i) EXPECT_EQ(masked.out[i], 0.0f) << simd_path_name(simd);
    for (int64_t i = 0; i < masked.lse.numel(); ++i)
      EXPECT_EQ(masked.lse[i], -std::numeric_limits<float>::infinity()) << simd_path_name(simd);
  }
}

// Head dims past kMaxHeadDim are refused on every path. With N = 0 and D = 2^60 (an empty .npy of
// shape (0, 2^60)) the fused kernel's tile-group size wrapped to 0 and the process died of SIGFPE;
// the reference returned an empty result. Stride-0 views: no memory behind the huge dim.
TEST(Limits, HeadDimsPastTheLimitAreRefusedOnEveryPath) {
  float one = 1.0f;
  for (const int64_t D : {kMaxHeadDim + 1, int64_t{1} << 60})
    for (const int64_t N : {int64_t{0}, int64_t{1}}) {
      const std::array<int64_t, 4> shape{1, 1, N, D}, zero{0, 0, 0, 0};
      const TensorView<const float> q(&one, shape, zero);
      Tensor<float> out({1, 1, N, D == kMaxHeadDim + 1 ? int64_t{4} : int64_t{4}});
      Tensor<float> v4({1, 1, N, 4});
      for (Kernel kernel : {Kernel::fused, Kernel::reference}) {
        AttentionOptions options;
        options.kernel = kernel;
        test::expect_error([&] { attention_forward(out.view(), {}, q, q, v4.cview(), options); },
                           {"head dims D = " + std::to_string(D) + " and Dv = 4 must be at most 1048576"});
      }
    }
  float* none = nullptr;
  const std::array<int64_t, 4> wide{1, 1, 1, kMaxHeadDim}, zero{0, 0, 0, 0};
  const TensorView<const float> q(&one, wide, zero);
  Tensor<float> v4({1, 1, 1, 4}), out({1, 1, 1, 4});
  v4[0] = 2.0f;
  attention_forward(out.view(), TensorView<float>(none, {}), q, q, v4.cview());  // the limit itself runs
  EXPECT_EQ(out[0], 2.0f);
}

TEST(Limits, MinusInfinityBiasMasksWholeRowsOnEveryPath) {
  test::Rng rng("Limits.MinusInfBias");
  const int64_t N = 7, M = 20;
  Tensor<float> q = rng.normal32({1, 1, N, 8}), k = rng.normal32({1, 1, M, 8}), v = rng.normal32({1, 1, M, 8});
  Tensor<float> bias({N, M});
  for (int64_t i = 0; i < bias.numel(); ++i)
    bias[i] = (i / M) % 2 == 0 ? -std::numeric_limits<float>::infinity() : static_cast<float>(rng.uniform(-1, 1));
  AttentionOptions options;
  options.mask.bias = broadcast_mask(bias.cview(), 1, 1, N, M, "bias");
  expect_paths_match_reference(q, k, v, "-inf bias rows", options);
  options.kernel = Kernel::fused;
  const Result got = run(q, k, v, options);
  for (int64_t i = 0; i < N; i += 2) EXPECT_EQ(got.lse[i], -std::numeric_limits<float>::infinity()) << "row " << i;
}

TEST(Limits, FindNonFiniteNamesTheFirstBadElementInTheViewsOwnShape) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  Tensor<float> t({3, 4});
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(i);
  EXPECT_FALSE(find_non_finite(t.cview()));
  t[1 * 4 + 2] = -inf;           // (1, 2); in the transposed view (2, 1)
  t[2 * 4 + 1] = std::nanf("");  // (2, 1); in the transposed view (1, 2), which comes first
  const TensorView<const float> tt = t.cview().transposed(0, 1);
  std::optional<NonFinite> bad = find_non_finite(tt);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->index, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(std::isnan(bad->value));
  bad = find_non_finite(t.cview());
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->index, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(bad->value, -inf);
  bad = find_non_finite(t.cview(), /*allow_neg_inf=*/true);  // -inf passes; NaN does not
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->index, (std::vector<int64_t>{2, 1}));
  t[2 * 4 + 1] = inf;
  bad = find_non_finite(t.cview(), /*allow_neg_inf=*/true);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->value, inf);
  const bf16 row[2] = {float_to_bf16(1.0f), float_to_bf16(-inf)};
  bad = find_non_finite(TensorView<const bf16>(row, {2}));
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->index, (std::vector<int64_t>{1}));

  EXPECT_FALSE(overflows_float32(std::numeric_limits<float>::max()));
  EXPECT_FALSE(overflows_float32(-1e38));
  EXPECT_TRUE(overflows_float32(3.5e38));
  EXPECT_TRUE(overflows_float32(-1e300));
  EXPECT_FALSE(overflows_float32(std::numeric_limits<double>::infinity())) << "already infinite: not an overflow";
  EXPECT_FALSE(overflows_float32(std::nan("")));
}

// A row of 2^40 float64 logits per thread cannot be allocated: qkv::OutOfMemory, not
// std::terminate from inside the threads' region.
TEST(Limits, WeightsOverKeysPastMemoryAreRefusedNotAborted) {
#ifdef QKV_TEST_UNDER_ASAN
  // ASan's operator new reports an 8 TB request as a fatal error whatever allocator_may_return_null
  // says; the plain build runs the test.
  GTEST_SKIP() << "under ASan a failed operator new aborts before std::bad_alloc can be thrown";
#endif
  const int64_t M = int64_t{1} << 40;
  const float one = 1.0f;
  const std::array<int64_t, 4> shape{1, 1, M, 1}, broadcast{0, 0, 0, 0};
  const TensorView<const float> q(&one, {1, 1, 1, 1}), k(&one, shape, broadcast);
  const std::vector<int64_t> rows{0};
  Tensor<float> values({1, 1, 1, 1});
  Tensor<int64_t> indices({1, 1, 1, 1});
  for (int threads : {1, 2}) {
    AttentionOptions options;
    options.num_threads = threads;
    try {
      attention_weights_topk(values.view(), indices.view(), q, k, {}, rows, 1, options);
      ADD_FAILURE() << "a row of 2^40 logits was allocated";
    } catch (const OutOfMemory& e) {
      EXPECT_NE(std::string(e.what()).find("attention weights: a row of 1099511627776 float64 logits per thread"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace qkv
