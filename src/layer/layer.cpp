#include "qkv/layer.h"

#include <array>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "core/blas.h"
#include "layer/layer_shapes.h"
#include "qkv/attention_options.h"
#include "qkv/utf8.h"

namespace qkv {
namespace {

// At most 2^40 elements (4 TiB of float32) per weight: far past any machine, and small enough
// that every byte count and product of the layer fits in int64.
constexpr int64_t kMaxLayerElements = int64_t{1} << 40;

LayerConfig resolve(const LayerConfig& in) {
  LayerConfig c = in;
  if (c.embed_dim < 1) throw Error(fmt::format("layer: embed_dim must be at least 1, got {}", c.embed_dim));
  if (c.num_heads < 1) throw Error(fmt::format("layer: num_heads must be at least 1, got {}", c.num_heads));
  if (c.num_kv_heads < 0 || c.head_dim < 0 || c.value_dim < 0)
    throw Error(fmt::format("layer: num_kv_heads, head_dim and value_dim must be >= 0 (0 = default), got {}, {}, {}",
                            c.num_kv_heads, c.head_dim, c.value_dim));
  if (c.residual && c.parameter_free) throw Error("layer: a parameter-free layer has no residual");
  // The note is saved as JSON text: a byte that is not UTF-8 would fail the save, after training.
  if (const std::size_t at = invalid_utf8_at(c.note); at != std::string_view::npos)
    throw Error(fmt::format("layer: the note is not valid UTF-8 (byte {})", at));
  if (c.parameter_free) {
    if (c.num_heads != 1 || c.num_kv_heads > 1)
      throw Error(fmt::format("layer: parameter-free mode needs 1 head, got num_heads = {}{}", c.num_heads,
                              c.num_kv_heads != 0 ? fmt::format(", num_kv_heads = {}", c.num_kv_heads) : ""));
    if ((c.head_dim != 0 && c.head_dim != c.embed_dim) || (c.value_dim != 0 && c.value_dim != c.embed_dim))
      throw Error(fmt::format("layer: parameter-free mode needs head_dim = value_dim = embed_dim = {}", c.embed_dim));
    if (c.bias) throw Error("layer: parameter-free mode has no biases (bias must be false)");
    c.num_kv_heads = 1;
    c.head_dim = c.value_dim = c.embed_dim;
    c.output_projection = false;
    return c;
  }
  if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
  require_head_groups(c.num_heads, c.num_kv_heads, "layer: num_heads, num_kv_heads");
  if (c.head_dim == 0) {
    if (c.embed_dim % c.num_heads != 0)
      throw Error(fmt::format("layer: embed_dim = {} is not divisible by num_heads = {}; set head_dim", c.embed_dim,
                              c.num_heads));
    c.head_dim = c.embed_dim / c.num_heads;
  }
  if (c.value_dim == 0) c.value_dim = c.head_dim;
  // The projections' widths and weight counts, without wrapping: head_dim = 2^62 with 4 heads
  // wrapped to a width of 0, built a layer of empty weights and crashed (SIGFPE) in forward.
  auto count = [](int64_t a, int64_t b, const char* what) {
    int64_t n = 0;
    if (__builtin_mul_overflow(a, b, &n) || n > kMaxLayerElements)
      throw Error(fmt::format("layer: {} = {} · {} is too large (at most {} elements)", what, a, b, kMaxLayerElements));
    return n;
  };
  count(c.embed_dim, count(c.num_heads, c.head_dim, "num_heads · head_dim"), "embed_dim · num_heads · head_dim");
  count(c.embed_dim, count(c.num_kv_heads, c.head_dim, "num_kv_heads · head_dim"),
        "embed_dim · num_kv_heads · head_dim");
  count(c.embed_dim, count(c.num_kv_heads, c.value_dim, "num_kv_heads · value_dim"),
        "embed_dim · num_kv_heads · value_dim");
  count(c.embed_dim, count(c.num_heads, c.value_dim, "num_heads · value_dim"), "embed_dim · num_heads · value_dim");
  if (c.residual && !c.output_projection && c.num_heads * c.value_dim != c.embed_dim)
    throw Error(
        fmt::format("layer: a residual needs an output of width embed_dim = {}: set output_projection, or "
                    "num_heads · value_dim = {}",
                    c.embed_dim, c.num_heads * c.value_dim));
  return c;
}

// Uniform in [-bound, bound) from mt19937_64's bits, so the weights are the same on every
// platform (std::uniform_real_distribution is implementation-defined).
void fill_uniform(Tensor<float>& t, double bound, std::mt19937_64& rng) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double u = static_cast<double>(rng() >> 11) * 0x1p-53;
    t[i] = static_cast<float>((2.0 * u - 1.0) * bound);
  }
}

// y[r, :] += b for every row of y [rows, n].
void add_bias(float* y, int64_t rows, const Tensor<float>& b) {
  if (b.numel() == 0) return;
  const int64_t n = b.numel();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) y[r * n + j] += b[j];
}

// out[rows, n] = in[rows, e] · w[e, n] + b, on up to `threads` threads.
void project(float* out, const float* in, int64_t rows, const Tensor<float>& w, const Tensor<float>& b, int threads) {
  const int64_t e = w.dim(0), n = w.dim(1);
  detail::sgemm(false, false, rows, n, e, 1.0f, in, e, w.data(), n, 0.0f, out, n, threads);
  add_bias(out, rows, b);
}

}  // namespace

namespace detail {

std::array<ParameterShape, 8> parameter_shapes(const LayerConfig& c) {
  const int64_t E = c.embed_dim, H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim, Dv = c.value_dim;
  const bool w = !c.parameter_free, o = w && c.output_projection, b = w && c.bias;
  auto shape = [](bool has, std::vector<int64_t> s) { return has ? s : std::vector<int64_t>{}; };
  return {{{"w_q", shape(w, {E, H * D})},
           {"w_k", shape(w, {E, Hkv * D})},
           {"w_v", shape(w, {E, Hkv * Dv})},
           {"w_o", shape(o, {H * Dv, E})},
           {"b_q", shape(b, {H * D})},
           {"b_k", shape(b, {Hkv * D})},
           {"b_v", shape(b, {Hkv * Dv})},
           {"b_o", shape(o && b, {E})}}};
}

void check_parameter_shapes(const MultiHeadAttention& layer, std::string_view what) {
  const std::array<const Tensor<float>*, 8> members{&layer.w_q, &layer.w_k, &layer.w_v, &layer.w_o,
                                                    &layer.b_q, &layer.b_k, &layer.b_v, &layer.b_o};
  const auto shapes = parameter_shapes(layer.config());
  for (std::size_t i = 0; i < members.size(); ++i) {
    const auto have = members[i]->shape();
    if (!std::equal(have.begin(), have.end(), shapes[i].shape.begin(), shapes[i].shape.end()))
      throw Error(fmt::format("{}: {} has shape {} but the layer's config needs {} (a weight assigned another shape)",
                              what, shapes[i].name, shape_string(have),
                              shapes[i].shape.empty() ? "none" : shape_string(shapes[i].shape)));
  }
}

}  // namespace detail

MultiHeadAttention::MultiHeadAttention(const LayerConfig& config) : config_(resolve(config)) {
  if (config_.parameter_free) return;
  const LayerConfig& c = config_;
  const int64_t E = c.embed_dim, H = c.num_heads, Dv = c.value_dim;
  const std::array<Tensor<float>*, 8> members{&w_q, &w_k, &w_v, &w_o, &b_q, &b_k, &b_v, &b_o};
  const auto shapes = detail::parameter_shapes(c);
  for (std::size_t i = 0; i < members.size(); ++i)
    if (!shapes[i].shape.empty()) *members[i] = Tensor<float>(shapes[i].shape, shapes[i].name);
  std::mt19937_64 rng(c.seed);
  const double in_bound = 1.0 / std::sqrt(static_cast<double>(E));
  fill_uniform(w_q, in_bound, rng);
  fill_uniform(w_k, in_bound, rng);
  fill_uniform(w_v, in_bound, rng);
  if (c.output_projection) fill_uniform(w_o, 1.0 / std::sqrt(static_cast<double>(H * Dv)), rng);
}

int64_t MultiHeadAttention::output_dim() const {
  return config_.output_projection ? config_.embed_dim : config_.num_heads * config_.value_dim;
}

std::vector<std::pair<std::string, const Tensor<float>*>> MultiHeadAttention::parameters() const {
  std::vector<std::pair<std::string, const Tensor<float>*>> out;
  const std::array<std::pair<const char*, const Tensor<float>*>, 8> all{{{"w_q", &w_q},
                                                                         {"w_k", &w_k},
                                                                         {"w_v", &w_v},
                                                                         {"w_o", &w_o},
                                                                         {"b_q", &b_q},
                                                                         {"b_k", &b_k},
                                                                         {"b_v", &b_v},
                                                                         {"b_o", &b_o}}};
  for (const auto& [name, t] : all)
    if (t->rank() > 0) out.emplace_back(name, t);
  return out;
}

std::vector<std::pair<std::string, Tensor<float>*>> MultiHeadAttention::parameters() {
  std::vector<std::pair<std::string, Tensor<float>*>> out;
  for (const auto& [name, t] : std::as_const(*this).parameters()) out.emplace_back(name, const_cast<Tensor<float>*>(t));
  return out;
}

Tensor<float> MultiHeadAttention::forward(TensorView<const float> x, TensorView<const float> kv,
                                          const AttentionOptions& options) const {
  return forward(x, kv, options, nullptr);
}

// x: [B, N, E], kv: [B, M, E] -> [B, N, E_out]. Projections are one sgemm each over all B·N rows;
// the heads are strided views of the projected rows, so nothing is transposed or copied.
Tensor<float> MultiHeadAttention::forward(TensorView<const float> x, TensorView<const float> kv,
                                          const AttentionOptions& options, LayerCache* cache) const {
  const detail::LayerDims d = detail::check_layer_inputs(config_, x, kv);
  detail::check_parameter_shapes(*this, "layer: forward");
  // Filled here and moved into *cache at the end. The old contents lend their buffers and stay
  // alive until then: x or kv may be views of them (forward again on cache.x), so a buffer they
  // overlap is not written before both are copied.
  LayerCache old = cache ? std::move(*cache) : LayerCache{}, c;
  auto lend = [&](Tensor<float>& t) {
    return detail::overlaps(x, t) || detail::overlaps(kv, t) ? Tensor<float>() : std::move(t);
  };
  c.batch = d.B;
  c.queries = d.N;
  c.keys = d.M;
  c.batched = d.batched;
  c.cross = d.cross;
  c.x = detail::contiguous_rows(x, d.B, d.N, config_.embed_dim, "x", lend(old.x));
  if (d.cross) c.kv = detail::contiguous_rows(kv, d.B, d.M, config_.embed_dim, "kv", lend(old.kv));
  for (auto [to, from] : {std::pair{&c.backward_dy, &old.backward_dy},
                          {&c.backward_dctx, &old.backward_dctx},
                          {&c.backward_dq, &old.backward_dq},
                          {&c.backward_dk, &old.backward_dk},
                          {&c.backward_dv, &old.backward_dv}})
    *to = lend(*from);
  const float* kv_rows = d.cross ? c.kv.data() : c.x.data();

  const LayerConfig& cf = config_;
  const int64_t H = cf.num_heads, Hkv = cf.num_kv_heads, D = cf.head_dim, Dv = cf.value_dim;
  const float *q_data = c.x.data(), *k_data = kv_rows, *v_data = kv_rows;
  if (!cf.parameter_free) {
    c.q = detail::reuse_or_new(lend(old.q), {d.B, d.N, H * D}, "q");
    c.k = detail::reuse_or_new(lend(old.k), {d.B, d.M, Hkv * D}, "k");
    c.v = detail::reuse_or_new(lend(old.v), {d.B, d.M, Hkv * Dv}, "v");
    project(c.q.data(), c.x.data(), d.B * d.N, w_q, b_q, options.num_threads);
    project(c.k.data(), kv_rows, d.B * d.M, w_k, b_k, options.num_threads);
    project(c.v.data(), kv_rows, d.B * d.M, w_v, b_v, options.num_threads);
    q_data = c.q.data();
    k_data = c.k.data();
    v_data = c.v.data();
  }
  c.ctx = detail::reuse_or_new(lend(old.ctx), {d.B, d.N, H * Dv}, "attention output");
  c.lse = detail::reuse_or_new(std::move(old.lse), {d.B, H, d.N}, "lse");
  attention_forward_lse64(detail::head_view(c.ctx.data(), d.B, H, d.N, Dv), c.lse.view(),
                          detail::head_view(q_data, d.B, H, d.N, D), detail::head_view(k_data, d.B, Hkv, d.M, D),
                          detail::head_view(v_data, d.B, Hkv, d.M, Dv), options);

  const int64_t out_dim = output_dim();
  Tensor<float> y =
      d.batched ? Tensor<float>({d.B, d.N, out_dim}, "layer output") : Tensor<float>({d.N, out_dim}, "layer output");
  if (cf.output_projection) {
    project(y.data(), c.ctx.data(), d.B * d.N, w_o, b_o, options.num_threads);
  } else {
    for (int64_t i = 0; i < y.numel(); ++i) y[i] = c.ctx[i];
  }
  if (cf.residual)
    for (int64_t i = 0; i < y.numel(); ++i) y[i] += c.x[i];
  if (cache) *cache = std::move(c);
  return y;
}

}  // namespace qkv
