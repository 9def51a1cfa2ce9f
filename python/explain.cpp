// qkv.explain: every intermediate step of attention for a short input, in float64, as a dict of
// numpy arrays (or the CLI's text / JSON renderings).
#include <optional>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include "bind_util.h"
#include "bindings.h"
#include "layer_binding.h"
#include "qkv/explain.h"
#include "qkv/layer.h"
#include "qkv/out_of_memory.h"
#include "qkv/render.h"

namespace qkvpy {
namespace {

using qkv::Matrix;

// A float32/float64 numpy array of rank 1 ([n] -> [1, n]) or 2 as a Matrix; empty for None.
Matrix to_matrix(const py::object& obj, const char* name) {
  if (obj.is_none()) return {};
  const DType t = dtype_of(obj, name);
  if (t == DType::bf16) throw py::type_error(fmt::format("{}: pass float32 or float64", name));
  const py::array a = py::array_t<double>::ensure(obj);
  if (a.ndim() != 1 && a.ndim() != 2)
    throw py::value_error(fmt::format("{}: expected a matrix, got shape {}", name, qkv::shape_string(shape_of(a))));
  const qkv::TensorView<const double> v = array_view<double>(a, name);
  const int64_t rows = a.ndim() == 2 ? v.dim(0) : 1, cols = v.dim(v.rank() - 1);
  Matrix m(rows, cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) m(i, j) = a.ndim() == 2 ? v(i, j) : v(j);
  return m;
}

py::object to_numpy(const Matrix& m) {
  if (m.empty()) return py::none();
  py::array_t<double> a({static_cast<py::ssize_t>(m.rows), static_cast<py::ssize_t>(m.cols)});
  std::copy(m.data.begin(), m.data.end(), a.mutable_data());
  return a;
}

// One field as Python: matrices as float64 arrays (None when empty), heads as dicts.
struct FieldObject {
  py::object operator()(const Matrix& m) const { return to_numpy(m); }
  py::object operator()(const std::vector<qkv::HeadSteps>& heads) const {
    py::list list;
    for (const qkv::HeadSteps& h : heads) list.append(dict(h));
    return list;
  }
  template <class T>
  py::object operator()(const T& value) const {
    return py::cast(value);
  }
  template <class S>
  py::dict dict(const S& steps) const {
    py::dict d;
    qkv::visit_fields(steps, [&](const char* name, const auto& value) { d[name] = (*this)(value); });
    return d;
  }
};

py::dict to_dict(const qkv::Explanation& e) { return FieldObject{}.dict(e); }

std::vector<std::string> tokens_for(const py::object& tokens, int64_t rows) {
  if (!tokens.is_none()) {
    if (!is_list_arg(tokens)) throw py::type_error("tokens must be a list of strings, one per row");
    std::vector<std::string> out;
    for (const py::handle t : tokens) out.push_back(string_arg(t, fmt::format("tokens[{}]", out.size())));
    return out;
  }
  std::vector<std::string> out;
  for (int64_t i = 0; i < rows; ++i) out.push_back(fmt::format("t{}", i));
  return out;
}

struct ExplainArgs {
  py::object example, tokens, x, layer, q, k, v, w_q, w_k, w_v, b_q, b_k, b_v, w_o, b_o;
  std::optional<int64_t> num_heads, num_kv_heads;  // unset: not given
};

// A layer brings its own heads and weights: an argument that would set them is refused unless it
// says what the layer has (it was ignored without a word).
void refuse_besides_layer(const ExplainArgs& a, const qkv::LayerConfig& layer) {
  for (const auto& [given, has, name] : {std::tuple{a.num_heads, layer.num_heads, "num_heads"},
                                         std::tuple{a.num_kv_heads, layer.num_kv_heads, "num_kv_heads"}})
    if (given && *given != has)
      throw py::value_error(
          fmt::format("explain: {}={} conflicts with layer, which has {}={}; leave {} out (the "
                      "layer brings its own)",
                      name, *given, name, has, name));
  for (const auto& [obj, name] : {std::pair{&a.b_q, "b_q"}, std::pair{&a.b_k, "b_k"}, std::pair{&a.b_v, "b_v"},
                                  std::pair{&a.w_o, "w_o"}, std::pair{&a.b_o, "b_o"}})
    if (!obj->is_none())
      throw py::value_error(fmt::format("explain: {} is not used with layer (the layer brings its own weights)", name));
}

qkv::Explanation build(const ExplainArgs& a) {
  const bool have_qkv = !a.q.is_none() || !a.k.is_none() || !a.v.is_none();
  const bool have_w = !a.w_q.is_none() || !a.w_k.is_none() || !a.w_v.is_none();
  const int sources = int(have_qkv) + int(have_w) + int(!a.layer.is_none()) + int(!a.example.is_none());
  if (sources > 1) throw py::value_error("explain: give one of example, (q, k, v), layer, or (w_q, w_k, w_v)");
  if (have_qkv) {
    if (a.q.is_none() || a.k.is_none() || a.v.is_none()) throw py::value_error("explain: q, k and v go together");
    if (!a.x.is_none()) throw py::value_error("explain: x is not used with q, k, v");
    Matrix q = to_matrix(a.q, "q");
    return qkv::explain_qkv(tokens_for(a.tokens, q.rows), std::move(q), to_matrix(a.k, "k"), to_matrix(a.v, "v"));
  }
  if (!a.example.is_none() || (a.x.is_none() && a.layer.is_none() && !have_w)) {
    if (!a.x.is_none() || !a.tokens.is_none()) throw py::value_error("explain: an example brings its own tokens and x");
    const std::string name = a.example.is_none() ? "seed-003" : string_arg(a.example, "example");
    return qkv::explain_example(name);
  }
  if (a.x.is_none()) throw py::value_error("explain: x (the embeddings [N, E]) is required");
  if (!a.layer.is_none()) {
    py::array owner;
    const qkv::TensorView<const float> x = float32_view(a.x, "x", owner);
    if (x.rank() != 2)
      throw py::value_error(fmt::format("x: expected [N, E], got shape {}", qkv::shape_string(x.shape())));
    if (!py::isinstance<PyLayer>(a.layer))
      throw py::type_error(
          fmt::format("layer must be a qkv.MultiHeadAttention, got {}", std::string(py::repr(a.layer))));
    const auto& layer = a.layer.cast<const PyLayer&>().layer;
    refuse_besides_layer(a, layer.config());
    return qkv::explain_layer(tokens_for(a.tokens, x.dim(0)), x, layer);
  }
  Matrix x = to_matrix(a.x, "x");
  std::vector<std::string> tokens = tokens_for(a.tokens, x.rows);
  if (!have_w) return qkv::explain_parameter_free(std::move(tokens), std::move(x));
  if (a.w_q.is_none() || a.w_k.is_none() || a.w_v.is_none())
    throw py::value_error("explain: w_q, w_k and w_v go together");
  return qkv::explain_projections(
      std::move(tokens), std::move(x), to_matrix(a.w_q, "w_q"), to_matrix(a.w_k, "w_k"), to_matrix(a.w_v, "w_v"),
      a.num_heads.value_or(1), a.num_kv_heads.value_or(a.num_heads.value_or(1)), to_matrix(a.b_q, "b_q"),
      to_matrix(a.b_k, "b_k"), to_matrix(a.b_v, "b_v"), to_matrix(a.w_o, "w_o"), to_matrix(a.b_o, "b_o"));
}

constexpr const char* kExplainDoc = R"(Every step of self-attention for a short input, computed in float64.

explain()                         the worked example of seed 003 (what `qkv explain` prints)
explain("playing-outside")        another built-in example (see qkv.explain_examples())
explain(x=X, w_q=.., w_k=.., w_v=.., num_heads=1, num_kv_heads=None, b_q=.., b_k=.., b_v=..,
        w_o=.., b_o=..)           from embeddings X [N, E] and projections (row-vector convention:
                                  Q = X @ w_q, w_q [E, H*D]); biases and w_o optional
explain(x=X, layer=layer)         what a qkv.MultiHeadAttention computes for X
explain(x=X)                      parameter-free attention: Q = K = V = X
explain(q=Q, k=K, v=V)            single-head attention from given q, k, v
tokens: one label per row (default t0, t1, ...). Arrays may be float32 or float64.

format: "dict" (default) returns {title, source, style, tokens, x, w_q, w_k, w_v, b_q, b_k, b_v,
w_o, b_o, parameter_free, num_heads, num_kv_heads, d_k, heads, concat, output}, matrices as
float64 numpy arrays (None where a step does not apply), heads a list of {q, k, v, scores,
scale, scaled_scores, weights, context}; "text" returns the readable step-by-step print
(`precision` decimals); "json" returns the JSON the CLI writes; "html" returns the page
`qkv explain --html` writes (up to 512 tokens) as a qkv.HtmlPage, a str that Jupyter shows inline
(its _repr_html_) and .save(path) writes. color_scale ("absolute", the default, or "row") sets the
page's colours: the weight itself from 0 to 1, or each row from 0 to its largest weight.
labels: optional {title, source, weights, style} strings that replace what the result says of
its input (qkv.explain(sentence=...) sets them).
Raises ValueError for inconsistent shapes or an unknown example name.)";

py::object explain(const py::object& example, const py::object& tokens, const py::object& x, const py::object& layer,
                   const py::object& q, const py::object& k, const py::object& v, const py::object& w_q,
                   const py::object& w_k, const py::object& w_v, const py::object& b_q, const py::object& b_k,
                   const py::object& b_v, const py::object& w_o, const py::object& b_o, const py::object& heads,
                   const py::object& kv_heads, const py::object& format_obj, const py::object& precision_obj,
                   const py::object& color_scale_obj, const py::object& labels) {
  const std::string format = string_arg(format_obj, "format");
  auto count = [](const py::object& obj, const char* name) {
    return obj.is_none() ? std::nullopt : std::optional<int64_t>(index_arg(obj, name));
  };
  const std::optional<int64_t> num_heads = count(heads, "num_heads"), num_kv_heads = count(kv_heads, "num_kv_heads");
  const int64_t digits = index_arg(precision_obj, "precision");
  if (digits < 0 || digits > 17) throw py::value_error(fmt::format("precision must be in [0, 17], got {}", digits));
  const int precision = static_cast<int>(digits);
  if (format != "dict" && format != "text" && format != "json" && format != "html")
    throw py::value_error(fmt::format("format must be 'dict', 'text', 'json' or 'html', got '{}'", format));
  const std::string scale_name = string_arg(color_scale_obj, "color_scale");
  const std::optional<qkv::ColorScale> scale = qkv::parse_color_scale(scale_name);
  if (!scale) throw py::value_error(fmt::format("color_scale must be 'absolute' or 'row', got '{}'", scale_name));
  const ExplainArgs args{example, tokens, x,   layer, q,   k,   v,         w_q,         w_k,
                         w_v,     b_q,    b_k, b_v,   w_o, b_o, num_heads, num_kv_heads};
  qkv::Explanation e;
  try {
    e = build(args);
  } catch (const std::bad_alloc&) {
    // The explanation keeps scores, scaled scores and weights, N x N float64 each, per head.
    // N: the rows of x, or of q on the (q, k, v) path.
    const py::object& rows = x.is_none() ? q : x;
    const uint64_t n = rows.is_none() ? 0 : static_cast<uint64_t>(py::len(rows));
    const int64_t h = layer.is_none() ? num_heads.value_or(1) : layer.cast<const PyLayer&>().layer.config().num_heads;
    throw qkv::OutOfMemory(fmt::format("explain: the N x N steps of {} tokens and {} heads", n, h),
                           3 * n * n * sizeof(double) * static_cast<uint64_t>(std::max<int64_t>(h, 1)));
  }
  // What qkv.explain(sentence=...) says of its input: the same title, source and weights lines
  // the CLI prints for a sentence.
  if (!labels.is_none()) {
    if (!py::isinstance<py::dict>(labels)) throw py::type_error("labels must be a dict of str");
    for (const auto& [key, value] : labels.cast<py::dict>()) {
      const std::string name = string_arg(key, "labels key"), text = string_arg(value, "labels[" + name + "]");
      if (name == "title")
        e.title = text;
      else if (name == "source")
        e.source = text;
      else if (name == "weights")
        e.weights = text;
      else if (name == "style")
        e.style = text;
      else
        throw py::value_error(fmt::format("labels: unknown key '{}' (title, source, weights, style)", name));
    }
  }
  if (format == "text") return py::str(qkv::explanation_to_text(e, precision));
  if (format == "json") return py::str(qkv::explanation_to_json(e));
  if (format == "html") {
    qkv::HtmlOptions options;
    options.color_scale = *scale;
    options.steps_hint = options.output_hint = "format=\"dict\"";
    // qkv.HtmlPage (python/qkv/__init__.py): the page as a str that notebooks show inline.
    return py::module_::import("qkv").attr("HtmlPage")(qkv::render_explanation_html(e, options));
  }
  return to_dict(e);
}

}  // namespace

void bind_explain(py::module_& m) {
  m.def("explain", &explain, py::arg("example") = py::none(), py::kw_only(), py::arg("tokens") = py::none(),
        py::arg("x") = py::none(), py::arg("layer") = py::none(), py::arg("q") = py::none(), py::arg("k") = py::none(),
        py::arg("v") = py::none(), py::arg("w_q") = py::none(), py::arg("w_k") = py::none(),
        py::arg("w_v") = py::none(), py::arg("b_q") = py::none(), py::arg("b_k") = py::none(),
        py::arg("b_v") = py::none(), py::arg("w_o") = py::none(), py::arg("b_o") = py::none(),
        py::arg("num_heads") = py::none(), py::arg("num_kv_heads") = py::none(), py::arg("format") = "dict",
        py::arg("precision") = 8, py::arg("color_scale") = "absolute", py::arg("labels") = py::none(), kExplainDoc);
  m.def("explain_examples", &qkv::example_names, "Names of the built-in worked examples qkv.explain() accepts.");
}

}  // namespace qkvpy
