// qkv.KVCache and qkv.decode_attention (include/qkv/kv_cache.h, decode.h) on numpy arrays.
// Arrays in are float32 (float64 is rounded once); the cache's pools are exposed as read-only
// numpy views that keep the cache alive.
#include <optional>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bare_new.h"
#include "bind_util.h"
#include "shared_reads.h"
#include "bindings.h"
#include "qkv/kv_cache.h"
#include "qkv/rotary.h"

namespace qkvpy {
namespace {

// Python threads may share a cache. Calls that change it (create, append, fork, free) hold the
// GIL throughout, so they never overlap each other or a read that holds the GIL. decode_attention
// and its weights read the pool with the GIL released, from a copy of the sequences' page tables
// and lengths: an append in another thread writes only slots past those lengths or free pages,
// but free() makes the pages of a sequence being read free, and the next append would overwrite
// them mid-read. So a decode registers as a reader (SharedReads, shared_reads.h) and free() waits
// until the cache has none.
using CacheReaders = SharedReads;

std::optional<qkv::RotaryOptions> parse_rotary(const py::object& rotary) {
  if (rotary.is_none()) return std::nullopt;
  if (!py::isinstance<py::dict>(rotary))
    throw py::type_error("rotary must be None or a dict(layout=, theta=, rotary_dim=)");
  const py::dict d = rotary.cast<py::dict>();
  qkv::RotaryOptions o;
  for (const auto& [key_obj, value] : d) {
    const std::string key = string_arg(key_obj, "a rotary key");
    if (key == "layout") {
      const std::string layout = string_arg(value, "rotary layout");
      if (layout == "interleaved")
        o.layout = qkv::RotaryLayout::interleaved;
      else if (layout == "half_split")
        o.layout = qkv::RotaryLayout::half_split;
      else
        throw py::value_error(fmt::format("rotary layout must be 'interleaved' or 'half_split', got '{}'", layout));
    } else if (key == "theta") {
      o.theta = number_arg(value, "rotary theta");
    } else if (key == "rotary_dim") {
      o.rotary_dim = index_arg(value, "rotary_dim");
    } else {
      throw py::type_error(fmt::format("rotary: unknown key '{}'", key));
    }
  }
  return o;
}

// A rotated copy of x [N, D], [H, N, D] or [B, H, N, D]: token n of batch row b at position
// positions[b] + n (positions: one integer for every row, or one per batch row).
py::array rotated(const py::object& x_obj, const py::object& positions, const py::object& rotary) {
  py::array owner;
  const qkv::TensorView<const float> x = float32_view(x_obj, "x", owner);
  if (x.rank() < 2 || x.rank() > 4)
    throw py::value_error(
        fmt::format("x: expected [N, D], [H, N, D] or [B, H, N, D], got shape {}", qkv::shape_string(x.shape())));
  py::array out = tensor_to_numpy(qkv::to_contiguous<float>(x));
  const qkv::TensorView<float> x4 = mutable_view<float>(out, "x").as_rank4();
  std::vector<int64_t> offsets;
  if (is_list_arg(positions)) {
    offsets = index_list_arg(positions, "positions");
    if (static_cast<int64_t>(offsets.size()) != x4.dim(0))
      throw py::value_error(
          fmt::format("positions: expected one per batch row (B = {}), got {}", x4.dim(0), offsets.size()));
  } else {
    offsets.assign(static_cast<std::size_t>(x4.dim(0)), index_arg(positions, "positions"));
  }
  const std::optional<qkv::RotaryOptions> r = parse_rotary(rotary);
  qkv::apply_rotary(x4, offsets, r ? *r : qkv::RotaryOptions{});
  return out;
}

// A read-only numpy view of a pool, owned by the Python cache object.
py::array pool_view(const py::object& owner, const void* data, py::dtype dtype, std::vector<int64_t> shape) {
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = dtype.itemsize();
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  py::array a(dtype, std::vector<py::ssize_t>(shape.begin(), shape.end()), strides, data, owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

py::dtype storage_dtype(qkv::KVDtype d) {
  switch (d) {
    case qkv::KVDtype::f32:
      return py::dtype::of<float>();
    case qkv::KVDtype::bf16:
    case qkv::KVDtype::f16:
      return py::dtype::of<uint16_t>();  // bf16 bits; fp16 bits (view as np.float16)
    case qkv::KVDtype::i8:
      return py::dtype::of<int8_t>();
  }
  return py::dtype::of<float>();
}

py::array raw_pool(const py::object& self, bool values) {
  const auto& c = self.cast<const qkv::KVCache&>();
  const qkv::KVCacheConfig& g = c.config();
  return pool_view(self, values ? c.v_pool() : c.k_pool(), storage_dtype(g.dtype),
                   {g.num_pages, g.Hkv, g.page_tokens, values ? g.Dv : g.D});
}

py::object raw_scales(const py::object& self, bool values) {
  const auto& c = self.cast<const qkv::KVCache&>();
  const qkv::KVCacheConfig& g = c.config();
  const float* scales = values ? c.v_scales() : c.k_scales();
  if (scales == nullptr) return py::none();
  return pool_view(self, scales, py::dtype::of<float>(), {g.num_pages, g.Hkv, g.page_tokens});
}

// The cache argument: TypeError "cache must be a qkv.KVCache, got <repr>" for anything else.
const qkv::KVCache& cache_arg(const py::object& obj) {
  if (!py::isinstance<qkv::KVCache>(obj))
    throw py::type_error(fmt::format("cache must be a qkv.KVCache, got {}", std::string(py::repr(obj))));
  return obj.cast<const qkv::KVCache&>();
}

// What decode_attention and its weights share: q as float32 [B, H, N, D], the sequences' pages,
// the options (causal bottom-right unless the mask dict says otherwise), and the read of the cache
// that keeps those pages from being freed until the call ends.
struct DecodeCall {
  py::array owner;
  qkv::TensorView<const float> q;
  std::optional<CacheReaders::Reading> reading;
  qkv::PagedKV kv;
  qkv::DecodeOptions options;
};

// Fills `c` from the caller's arguments as given (the Python wrapper passes them unconverted, so a
// float id or a truthy string is refused here, not rounded or taken as True). The read starts
// before the page tables are copied: a free() waiting for another call's read would otherwise
// run between the copy and this call's read, and an append could refill the pages it copied.
void decode_call(DecodeCall& c, const py::object& q_obj, const py::object& cache_obj, const py::object& seq_ids,
                 const py::dict& mask, const py::object& scale, const py::object& sinks, const py::object& sink_tokens,
                 int num_threads, const std::string& simd) {
  c.q = float32_view(q_obj, "q", c.owner);
  if (c.q.rank() != 4)
    throw py::value_error(fmt::format("q must be [B, H, N, D], got {}", qkv::shape_string(c.q.shape())));
  const std::vector<int64_t> ids = index_list_arg(seq_ids, "seq_ids");
  c.options.attention.scale = scale_arg(scale);
  if (!sinks.is_none()) {
    if (!is_list_arg(sinks))
      throw py::type_error(
          fmt::format("sinks must be None or a sequence of numbers, got {}", std::string(py::repr(sinks))));
    for (const py::handle s : sinks) {
      const std::size_t h = c.options.sinks.size();
      const double sink = number_arg(s, fmt::format("sinks[{}]", h));
      if (qkv::overflows_float32(sink))
        throw py::value_error(fmt::format("sinks[{}] = {} is beyond float32's range (FLT_MAX, 3.4e38)", h, sink));
      c.options.sinks.push_back(static_cast<float>(sink));
    }
  }
  c.options.sink_tokens = index_arg(sink_tokens, "sink_tokens");
  c.options.attention.num_threads = num_threads;
  c.options.attention.simd = qkv::parse_simd(simd);
  const qkv::KVCache& cache = cache_arg(cache_obj);
  c.reading.emplace(&cache);
  c.kv = cache.paged(ids);
  int64_t M = 0;
  for (int64_t len : c.kv.seq_lens) M = std::max(M, len);
  py::dict m = mask;
  if (!m.contains("causal_align")) m["causal_align"] = "bottom_right";
  c.options.attention.mask = parse_mask(m, c.q.dim(0), c.q.dim(1), c.q.dim(2), M).mask;
}

py::object decode(const py::object& q_obj, const py::object& cache, const py::object& seq_ids, const py::dict& mask,
                  const py::object& scale, const py::object& sinks, const py::object& sink_tokens,
                  const py::object& return_lse_obj, const py::object& num_threads, const py::object& simd) {
  const bool return_lse = flag_arg(return_lse_obj, "return_lse");
  DecodeCall c;
  decode_call(c, q_obj, cache, seq_ids, mask, scale, sinks, sink_tokens, threads_arg(num_threads),
              string_arg(simd, "simd"));
  py::array out = new_array<float>({c.q.dim(0), c.q.dim(1), c.q.dim(2), c.kv.Dv});
  py::array lse = new_array<float>({c.q.dim(0), c.q.dim(1), c.q.dim(2)});
  {
    InterruptibleRelease release;  // Ctrl-C stops it
    qkv::decode_attention(mutable_view<float>(out, "out"), mutable_view<float>(lse, "lse"), c.q, c.kv, c.options);
  }
  if (return_lse) return py::make_tuple(out, lse);
  return out;
}

// Full rows [B, H, N, max len], or the top_k largest as (values, indices) [B, H, N, top_k].
py::object decode_weights(const py::object& q_obj, const py::object& cache, const py::object& seq_ids,
                          const py::dict& mask, const py::object& scale, const py::object& sinks,
                          const py::object& sink_tokens, const py::object& top_k) {
  DecodeCall c;
  decode_call(c, q_obj, cache, seq_ids, mask, scale, sinks, sink_tokens, 1, "auto");
  const int64_t B = c.q.dim(0), H = c.q.dim(1), N = c.q.dim(2);
  if (top_k.is_none()) {
    int64_t M = 0;
    for (int64_t len : c.kv.seq_lens) M = std::max(M, len);
    py::array w = new_array<float>({B, H, N, M});
    {
      InterruptibleRelease release;  // Ctrl-C stops it
      qkv::decode_attention_weights(mutable_view<float>(w, "weights"), c.q, c.kv, {}, c.options);
    }
    return w;
  }
  const int64_t k = index_arg(top_k, "top_k");
  // A k below 1 gets empty arrays, so decode_attention_top_k refuses it by its own rule.
  auto [values, indices] = new_top_k({B, H, N, std::max<int64_t>(k, 0)});
  {
    InterruptibleRelease release;  // Ctrl-C stops it
    qkv::decode_attention_top_k(mutable_view<float>(values, "values"), mutable_view<int64_t>(indices, "indices"), c.q,
                                c.kv, {}, k, c.options);
  }
  return py::make_tuple(values, indices);
}

}  // namespace

void bind_cache(py::module_& m) {
  py::class_<qkv::KVCache>(m, "KVCache",
                           "A paged KV cache of one attention layer (see include/qkv/kv_cache.h): pools of "
                           "num_pages pages of page_tokens tokens, for kv_heads heads of head_dim (keys) and "
                           "value_dim (values), stored as dtype 'f32', 'bf16', 'f16' or 'i8'. Threads may share "
                           "one: decode_attention runs without the GIL beside appends to other sequences, and "
                           "free() waits until no decode_attention call is reading the cache.")
      // Sizes and sequence ids are checked by index_arg: pybind11's int64_t took True as 1, and
      // a float as a signature dump.
      .def(py::init([](const py::object& num_pages, const py::object& page_tokens, const py::object& kv_heads,
                       const py::object& head_dim, const py::object& value_dim, const py::object& dtype) {
             const int64_t d = index_arg(head_dim, "head_dim");
             const int64_t dv = value_dim.is_none() ? d : index_arg(value_dim, "value_dim");
             return qkv::KVCache({index_arg(num_pages, "num_pages"), index_arg(page_tokens, "page_tokens"),
                                  index_arg(kv_heads, "kv_heads"), d, dv,
                                  qkv::parse_kv_dtype(string_arg(dtype, "dtype"))});
           }),
           py::arg("num_pages"), py::arg("page_tokens"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("value_dim") = py::none(), py::arg("dtype") = "f32")
      // Methods take the cache by reference, never by pointer: pybind11 passes None as a null pointer.
      .def(
          "create", [](qkv::KVCache& c) { return c.create(); }, "A new empty sequence; returns its id.")
      .def(
          "append",
          [](qkv::KVCache& c, const py::object& seq, const py::object& k, const py::object& v,
             const py::object& rotary) {
            py::array ko, vo;
            const auto kv = float32_view(k, "k", ko), vv = float32_view(v, "v", vo);
            const std::optional<qkv::RotaryOptions> r = parse_rotary(rotary);
            c.append(index_arg(seq, "seq"), kv, vv, r ? &*r : nullptr);
          },
          py::arg("seq"), py::arg("k"), py::arg("v"), py::arg("rotary") = py::none(),
          "Appends k [T, kv_heads, head_dim] and v [T, kv_heads, value_dim]; all or nothing. rotary: a dict "
          "(layout='half_split'|'interleaved', theta=10000, rotary_dim=0) rotates k at the sequence's positions.")
      .def(
          "fork", [](qkv::KVCache& c, const py::object& seq) { return c.fork(index_arg(seq, "seq")); }, py::arg("seq"),
          "A new sequence sharing seq's pages; returns its id.")
      .def(
          "free",
          [](qkv::KVCache& c, const py::object& seq) {
            const int64_t id = index_arg(seq, "seq");
            const CacheReaders::Writing writing(&c);
            c.free(id);
          },
          py::arg("seq"))
      .def(
          "length", [](const qkv::KVCache& c, const py::object& seq) { return c.length(index_arg(seq, "seq")); },
          py::arg("seq"))
      .def(
          "pages",
          [](const qkv::KVCache& c, const py::object& seq) {
            const auto p = c.pages(index_arg(seq, "seq"));
            return std::vector<int32_t>(p.begin(), p.end());
          },
          py::arg("seq"))
      .def_property_readonly("free_pages", [](const qkv::KVCache& c) { return c.free_pages(); })
      .def_property_readonly("pool_bytes", [](const qkv::KVCache& c) { return c.pool_bytes(); })
      .def(
          "keys",
          [](const qkv::KVCache& c, const py::object& seq) { return tensor_to_numpy(c.keys(index_arg(seq, "seq"))); },
          py::arg("seq"), "The stored keys of seq as float32 [kv_heads, length, head_dim] (a copy).")
      .def(
          "values",
          [](const qkv::KVCache& c, const py::object& seq) { return tensor_to_numpy(c.values(index_arg(seq, "seq"))); },
          py::arg("seq"))
      .def_property_readonly(
          "k_pool", [](const py::object& self) { return raw_pool(self, false); },
          "Read-only view of the raw key pages [num_pages, kv_heads, page_tokens, head_dim] "
          "(float32, uint16 bits of bf16 or fp16, or int8).")
      .def_property_readonly("v_pool", [](const py::object& self) { return raw_pool(self, true); })
      .def_property_readonly(
          "k_scales", [](const py::object& self) { return raw_scales(self, false); },
          "i8 only: read-only view of the key scales [num_pages, kv_heads, page_tokens]; else None.")
      .def_property_readonly("v_scales", [](const py::object& self) { return raw_scales(self, true); });
  refuse_bare_new(m.attr("KVCache"));
  m.def("apply_rotary", &rotated, py::arg("x"), py::arg("positions"), py::arg("rotary"),
        "Core of qkv.apply_rotary; rotary is a dict(layout=, theta=, rotary_dim=).");
  m.def("decode_attention", &decode, py::arg("q"), py::arg("cache"), py::arg("seq_ids"), py::arg("mask"),
        py::arg("scale"), py::arg("sinks"), py::arg("sink_tokens"), py::arg("return_lse"), py::arg("num_threads"),
        py::arg("simd"), "Core of qkv.decode_attention; mask is a dict of mask keyword arguments.");
  m.def("decode_attention_weights", &decode_weights, py::arg("q"), py::arg("cache"), py::arg("seq_ids"),
        py::arg("mask"), py::arg("scale"), py::arg("sinks"), py::arg("sink_tokens"), py::arg("top_k"),
        "Core of qkv.decode_attention_weights.");
}

}  // namespace qkvpy
