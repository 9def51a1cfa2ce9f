// qkv.attention_weights: exact softmax weights for chosen query rows (or their top k), without
// ever forming the N x M matrix of the whole call.
#include <algorithm>

#include <fmt/format.h>

#include "bind_util.h"
#include "bindings.h"
#include "qkv/weights.h"

namespace qkvpy {
namespace {

std::vector<int64_t> parse_rows(const py::object& rows, int64_t N) {
  std::vector<int64_t> out;
  if (rows.is_none()) {
    for (int64_t i = 0; i < N; ++i) out.push_back(i);
    return out;
  }
  auto add = [&](const py::handle& item, const std::string& name) {
    const int64_t r = index_arg(item, name);
    if (r < -N || r >= N) throw py::value_error(fmt::format("rows: index {} is outside [-{}, {})", r, N, N));
    out.push_back(r < 0 ? r + N : r);  // negative indices count from the end, as in numpy
  };
  if (is_list_arg(rows)) {
    for (const py::handle item : rows) add(item, fmt::format("rows[{}]", out.size()));
  } else if (PyIndex_Check(rows.ptr())) {
    add(rows, "rows");
  } else {
    throw py::type_error("rows must be an int or a sequence of ints");
  }
  return out;
}

py::object weights(const py::object& q_obj, const py::object& k_obj, const py::object& rows_obj,
                   const py::object& top_k, const py::object& lse_obj, const py::dict& mask, const py::object& scale,
                   const py::object& num_threads) {
  py::array q_owner, k_owner, lse_owner;
  const qkv::TensorView<const float> q = float32_view(q_obj, "q", q_owner);
  const qkv::TensorView<const float> k = float32_view(k_obj, "k", k_owner);
  check_qkv_shapes(q_owner, k_owner, k_owner);
  const CallOptions options{.mask = mask, .scale = scale, .num_threads = threads_arg(num_threads)};
  const AttentionCall call = prepare_call(q_owner, k_owner, k_owner, options);
  const int64_t N = q.dim(q.rank() - 2), M = k.dim(k.rank() - 2);
  // With no keys and no top_k the result is empty: rows=None then lists no rows, since N may be a
  // broadcast q's billions.
  const bool no_weights = top_k.is_none() && M == 0;
  const std::vector<int64_t> rows = no_weights && rows_obj.is_none() ? std::vector<int64_t>{} : parse_rows(rows_obj, N);
  qkv::TensorView<const float> lse3;
  if (!lse_obj.is_none()) {
    // float32 or float64 only, as the forward returns it (ensure() cast strings and complex too).
    const qkv::TensorView<const float> lse = float32_view(lse_obj, "lse", lse_owner);
    qkv::require_shape(lse.shape(), call.lse_shape, "lse");
    lse3 = lse_view(lse);
  }
  std::vector<int64_t> shape = call.lse_shape;  // q.shape[:-1], whose last entry N becomes R
  shape.back() = no_weights && rows_obj.is_none() ? N : static_cast<int64_t>(rows.size());
  if (top_k.is_none()) {
    shape.push_back(M);
    py::array out = new_array<float>(shape);
    if (no_weights) return out;
    const qkv::TensorView<float> w = mutable_view<float>(out, "weights").as_rank4();
    InterruptibleRelease release;  // Ctrl-C stops it
    qkv::attention_weights_rows(w, q.as_rank4(), k.as_rank4(), lse3, rows, call.options);
    return out;
  }
  const int64_t kk = index_arg(top_k, "top_k");
  shape.push_back(std::max<int64_t>(kk, 0));  // a k below 1: empty arrays, refused by the library's rule
  auto [values, indices] = new_top_k(shape);
  const qkv::TensorView<float> vv = mutable_view<float>(values, "values").as_rank4();
  const qkv::TensorView<int64_t> iv = mutable_view<int64_t>(indices, "indices").as_rank4();
  {
    InterruptibleRelease release;  // Ctrl-C stops it
    qkv::attention_weights_topk(vv, iv, q.as_rank4(), k.as_rank4(), lse3, rows, kk, call.options);
  }
  return py::make_tuple(values, indices);
}

constexpr const char* kWeightsDoc =
    R"(attention_weights(q, k, *, rows=None, top_k=None, lse=None, <mask keywords>, scale=None, num_threads=0)

Exact softmax weights of chosen query rows, recomputed from q and k (scores in float64 from the
float32 inputs; float64 q, k are rounded to float32 first), without forming the full N x M
matrix: memory is O(M) per thread besides the result.

q [..., N, D], k [..., M, D] as for scaled_dot_product_attention (ranks 2-4, grouped-query heads,
the same mask keywords and scale). rows: an int or a sequence of query indices (negative counts
from the end; default: all N rows). lse: the forward's log-sum-exp [..., N] (return_lse=True),
so the weights are the ones the fused kernel normalized; default: recomputed in float64.
Returns weights [..., R, M] (float32; masked keys and fully masked rows are 0), or with top_k a
tuple (values [..., R, top_k] float32, indices [..., R, top_k] int64), largest first, ties to the
lower key index; slots beyond a row's allowed keys hold 0 and index -1.
Raises TypeError / ValueError for bad types, shapes, row indices or top_k < 1.)";

}  // namespace

void bind_weights(py::module_& m) {
  m.def("attention_weights", &weights, py::arg("q"), py::arg("k"), py::arg("rows"), py::arg("top_k"), py::arg("lse"),
        py::arg("mask"), py::arg("scale"), py::arg("num_threads"), kWeightsDoc);
}

}  // namespace qkvpy
