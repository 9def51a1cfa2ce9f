// fp32 attention backward driver, FlashAttention-2 style with no N×M buffer: the work is split
// into tasks of (b, kv head, chunk of query rows), each computed start to end by one thread with
// the chosen SIMD family's task (src/kernels/backward_tile.h). Chunks are planned from the shape
// alone and their partial dk, dv sums are added in chunk order, so every bit of the result is the
// same for any thread count. Masks go through MaskEval, exactly as in the forward.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <vector>

#include "attention/backward_checks.h"
#include "attention/backward_rows.h"
#include "attention/overflow.h"
#include "kernels/backward_kernel.h"
#include "kernels/dispatch.h"
#include "kernels/flush_subnormals.h"
#include "kernels/mask_eval.h"
#include "qkv/backward.h"
#include "qkv/reference.h"
#include "qkv/interrupt.h"

namespace qkv {
namespace {

constexpr int64_t kTile = kernels::kBackwardTile;

// Query rows per chunk (whole tiles), from the shape alone. A (b, kv head) is split into up to 4
// chunks while there would be fewer than 4 tasks, so 2 or 3 threads still share shapes with
// B·Hkv = 1; each extra chunk costs one partial copy of dk and dv.
int64_t plan_chunk_rows(const AttentionShape& s) {
  const int64_t tiles = (s.N + kTile - 1) / kTile;
  int64_t chunks = 1;
  while (s.B * s.Hkv * chunks < 4 && chunks * 2 <= std::min<int64_t>(tiles, 4)) chunks *= 2;
  return std::max<int64_t>(1, (tiles + chunks - 1) / chunks) * kTile;
}

// Key tiles per group: a task visits each query tile against a group's key tiles in turn
// (backward_tile.h), so the chunk's packed q, dout and dq, which outgrow L2 from N of about 2048
// (3 MiB at S4), come from L3 once per group instead of once per key tile: 4 tiles ran S4 and S6
// about 3% faster than 1, 8 no faster than 4 (measured). A key tile's buffers (kᵀ, k, vᵀ and its
// dk, dv rows) must stay in L2 next to a query tile's: at most 640 KB for the group.
int64_t plan_key_group(const AttentionShape& s) {
  constexpr int64_t kGroupBytes = 640 * 1024, kMaxGroup = 4;
  const int64_t tile_bytes = kTile * (3 * s.D + 2 * s.Dv) * static_cast<int64_t>(sizeof(float));
  const int64_t key_tiles = std::max<int64_t>(1, (s.M + kTile - 1) / kTile);
  return std::clamp<int64_t>(kGroupBytes / std::max<int64_t>(tile_bytes, 1), 1, std::min(kMaxGroup, key_tiles));
}

void fill4(const TensorView<float>& t, float value) {
  for_each_element(t, [value](float& x, const auto&) { x = value; });
}

detail::Overflow fp32_backward_overflow() {
  return {"attention_backward", "float32", "3.4e38", detail::kFp32OverflowRemedy};
}

// Kernel::reference: the float64 oracle on widened inputs, each gradient rounded once.
void reference_backward_f32(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                            TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                            TensorView<const float> v, const AttentionOptions& options) {
  const Tensor<double> q64 = to_contiguous<double>(q), k64 = to_contiguous<double>(k), v64 = to_contiguous<double>(v),
                       dout64 = to_contiguous<double>(dout);
  Tensor<double> dq64(dq.shape(), "dq"), dk64(dk.shape(), "dk"), dv64(dv.shape(), "dv"), dbias64;
  if (!dbias.empty()) dbias64 = Tensor<double>(dbias.shape(), "dbias");
  reference_attention_backward(dq64.view(), dk64.view(), dv64.view(),
                               dbias.empty() ? TensorView<double>() : dbias64.view(), dout64.cview(), q64.cview(),
                               k64.cview(), v64.cview(), options);
  const std::pair<TensorView<float>, const Tensor<double>*> outputs[] = {
      {dq, &dq64}, {dk, &dk64}, {dv, &dv64}, {dbias, &dbias64}};
  bool finite = true;
  for (const auto& [to, from] : outputs) {
    if (to.empty()) continue;
    const double* x = from->data();
    for_each_element(to, [&](float& y, const auto&) {
      y = static_cast<float>(*x++);
      finite = finite && std::isfinite(y);
    });
  }
  // A gradient past float32's range, rounded to inf, is refused as the fused kernel refuses it.
  if (!finite) detail::refuse_overflow(fp32_backward_overflow(), q, k, v, options.mask, &dout);
}

// lse of L: float, or double (the forward's lse without its rounding to fp32).
template <class L>
void backward_any(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                  TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                  TensorView<const float> v, TensorView<const float> out, TensorView<const L> lse,
                  const AttentionOptions& options, detail::BackwardRows rows = {}) {
  const AttentionShape s = check_attention_shapes(q.shape(), k.shape(), v.shape(), options);
  detail::check_backward_outputs(s, dq.shape(), dk.shape(), dv.shape(), dbias, dout.shape());
  require_shape(out.shape(), std::array<int64_t, 4>{s.B, s.H, s.N, s.Dv}, "out");
  require_shape(lse.shape(), std::array<int64_t, 3>{s.B, s.H, s.N}, "lse");
  if (options.kernel == Kernel::reference) {
    reference_backward_f32(dq, dk, dv, dbias, dout, q, k, v, options);
    return;
  }
  const kernels::BackwardFn fn = kernels::kernel_family(kernels::resolve_simd(options.simd)).backward_task;

  const detail::MaskEval mask(options.mask, s);
  std::vector<detail::KeyBand> bands(static_cast<std::size_t>(s.B * s.N));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.N; ++i) bands[b * s.N + i] = mask.band(b, i);
  if (!dbias.empty()) fill4(dbias, 0.0f);  // tile pairs that no query can see are never visited
  if (s.N == 0) {                          // no query: nothing depends on k or v
    fill4(dk, 0.0f);
    fill4(dv, 0.0f);
    return;
  }

  kernels::BackwardParams p(kernels::forward_params(q, k, v, s, options, mask));
  // The forward's out and lse are inputs here: the backward only reads them.
  p.out = const_cast<float*>(out.data()), p.out_stride = kernels::strides_of(out);
  if constexpr (std::is_same_v<L, double>)
    p.lse_wide = const_cast<double*>(lse.data());
  else
    p.lse = const_cast<float*>(lse.data());
  p.lse_stride = kernels::strides_of(lse);
  p.dout = dout.data(), p.dout_stride = kernels::strides_of(dout);
  p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  p.dq_stride = kernels::strides_of(dq), p.dk_stride = kernels::strides_of(dk), p.dv_stride = kernels::strides_of(dv);
  p.dbias = dbias.empty() ? nullptr : dbias.data(), p.dbias_stride = kernels::strides_of(dbias);
  p.bands = bands.data();
  p.whole_rows = !rows.partial;
  p.chunk_rows = plan_chunk_rows(s);
  p.chunks = (s.N + p.chunk_rows - 1) / p.chunk_rows;
  p.key_group = plan_key_group(s);
  const int64_t heads = s.B * s.Hkv, tasks = heads * p.chunks;
  Tensor<float> dk_part, dv_part;
  if (p.chunks > 1) {
    dk_part = Tensor<float>({p.chunks - 1, heads, s.M, s.D}, "attention_backward partial dk");
    dv_part = Tensor<float>({p.chunks - 1, heads, s.M, s.Dv}, "attention_backward partial dv");
    p.dk_part = dk_part.data(), p.dv_part = dv_part.data();
  }

  // Scratch is allocated before the parallel region, so nothing inside it can throw.
  const int threads = resolve_num_threads(options.num_threads, tasks);
  const int64_t scratch_floats = kernels::BackwardLayout(p).total;
  std::vector<Tensor<float>> scratch;
  for (int t = 0; t < threads; ++t)
    scratch.emplace_back(std::array<int64_t, 1>{scratch_floats}, "attention_backward scratch");

  // Later chunks are heavier under a causal mask, so they go first; the order cannot change the
  // result because each task is computed by one thread from start to end.
  auto run_task = [&](int64_t idx, float* mine) {
    const int64_t chunk = p.chunks - 1 - idx / heads, bh = idx % heads;
    const kernels::FlushSubnormals flush;
    fn(p, kernels::BackwardTask{bh / s.Hkv, bh % s.Hkv, chunk}, mine);
  };
  std::atomic<bool> nonfinite{false};  // set by the tasks and add_partials (see the end)
  p.nonfinite = &nonfinite;
  // dk, dv += the later chunks' partial sums, in chunk order; finite partials can sum past the range.
  auto add_partials = [&](int64_t key) {
    const int64_t b = key / (s.Hkv * s.M), hk = key / s.M % s.Hkv, j = key % s.M;
    bool finite = true;
    for (int64_t c = 1; c < p.chunks; ++c) {
      const float* pk = p.dk_part + ((c - 1) * heads * s.M + key) * s.D;
      const float* pv = p.dv_part + ((c - 1) * heads * s.M + key) * s.Dv;
      for (int64_t d = 0; d < s.D; ++d) finite &= std::isfinite(dk(b, hk, j, d) += pk[d]);
      for (int64_t e = 0; e < s.Dv; ++e) finite &= std::isfinite(dv(b, hk, j, e) += pv[e]);
    }
    if (!finite) nonfinite.store(true, std::memory_order_relaxed);
  };
  const int64_t keys = p.chunks > 1 ? heads * s.M : 0;
  // A stop request skips the remaining tasks (and key groups); the caller discards the partial gradients.
  InterruptScope* const interrupt = InterruptScope::current();
  p.interrupt = interrupt;
  if (threads == 1) {
    for (int64_t idx = 0; idx < tasks && !stop_requested(interrupt); ++idx) run_task(idx, scratch[0].data());
    throw_if_stopped(interrupt);
    for (int64_t key = 0; key < keys; ++key) add_partials(key);
  } else if (keys == 0) {
    // Every barrier costs a lot on a loaded machine (a waiting thread spins on a core the others
    // need), so there is one per call when the chunks need no sum.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t idx = 0; idx < tasks; ++idx)
      if (!stop_requested(interrupt)) run_task(idx, scratch[static_cast<std::size_t>(omp_get_thread_num())].data());
  } else {
#pragma omp parallel num_threads(threads)
    {
      float* mine = scratch[static_cast<std::size_t>(omp_get_thread_num())].data();
#pragma omp for schedule(dynamic, 1)
      for (int64_t idx = 0; idx < tasks; ++idx)
        if (!stop_requested(interrupt)) run_task(idx, mine);
#pragma omp for schedule(static) nowait
      for (int64_t key = 0; key < keys; ++key) add_partials(key);
    }
  }
  throw_if_stopped(interrupt);
  // The tasks and partial sums flag an inf or NaN gradient as they write it. Non-finite inputs, out,
  // or a NaN in lse explain it; otherwise it is an fp32 overflow (dout·v or a sum past the range).
  if (nonfinite.load()) {
    bool lse_nan = false;
    for_each_element(lse, [&](const L& x, const auto&) { lse_nan = lse_nan || std::isnan(x); });
    detail::refuse_overflow(fp32_backward_overflow(), q, k, v, options.mask, &dout,
                            !detail::all_finite(out) || lse_nan);
  }
}

}  // namespace

void attention_backward(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                        TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                        const AttentionOptions& options) {
  backward_any(dq, dk, dv, dbias, dout, q, k, v, out, lse, options);
}

void attention_backward(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                        TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> out, TensorView<const double> lse,
                        const AttentionOptions& options) {
  backward_any(dq, dk, dv, dbias, dout, q, k, v, out, lse, options);
}

namespace detail {

void attention_backward_rows(TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, TensorView<float> dbias,
                             TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                             TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                             const AttentionOptions& options, BackwardRows rows) {
  backward_any(dq, dk, dv, dbias, dout, q, k, v, out, lse, options, rows);
}

}  // namespace detail
}  // namespace qkv
