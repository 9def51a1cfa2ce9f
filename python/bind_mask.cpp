// The mask and dropout dictionary every attention entry point accepts, translated to the core's
// types: Python's types are checked here (TypeError), every value by the rules all front ends
// share (qkv/options_parse.h, whose qkv::Error is raised as ValueError).
#include "bind_mask.h"

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bind_util.h"
#include "qkv/options_parse.h"

namespace qkvpy {
namespace {

std::vector<int64_t> parse_lengths(const py::handle& obj, int64_t B, const char* name) {
  if (obj.is_none()) return {};
  if (!is_list_arg(obj)) {
    if (PyIndex_Check(obj.ptr()) && !is_bool(obj))
      return std::vector<int64_t>(static_cast<std::size_t>(B), index_arg(obj, name));
    throw py::type_error(fmt::format("{} must be an int or a sequence of {} ints (one per batch row)", name, B));
  }
  std::vector<int64_t> out;
  std::size_t i = 0;
  for (const py::handle item : obj) out.push_back(index_arg(item, fmt::format("{}[{}]", name, i++)));
  // Each length's range is checked with the shapes (check_attention_shapes).
  qkv::check_lengths(out, B, std::numeric_limits<int64_t>::max(), name);
  return out;
}

qkv::CausalAlign parse_align(const py::handle& obj) {
  if (!obj.is_none() && !py::isinstance<py::str>(obj)) throw py::type_error("causal_align must be a string");
  return qkv::parse_causal_align(obj.is_none() ? "top_left" : py::cast<std::string>(obj));
}

std::optional<qkv::Window> parse_window(const py::handle& obj) {
  if (obj.is_none()) return std::nullopt;
  if (!is_list_arg(obj) || py::len(obj) != 2)
    throw py::type_error("window must be a pair (left, right); None or a negative bound means unbounded");
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  qkv::Window w;
  w.left = seq[0].is_none() ? -1 : index_arg(seq[0], "window[0]");
  w.right = seq[1].is_none() ? -1 : index_arg(seq[1], "window[1]");
  return w;
}

}  // namespace

MaskArgs parse_mask(const py::dict& kwargs, int64_t B, int64_t H, int64_t N, int64_t M) {
  auto get = [&](const char* key) -> py::object {
    return kwargs.contains(key) ? py::reinterpret_borrow<py::object>(kwargs[key]) : py::none();
  };
  MaskArgs out;
  qkv::Mask& mask = out.mask;
  const qkv::CausalAlign align = parse_align(get("causal_align"));
  const py::object causal = get("causal");
  if (!causal.is_none() && flag_arg(causal, "causal")) mask.causal = align;
  mask.diagonal = align;
  mask.window = parse_window(get("window"));
  mask.key_lengths = parse_lengths(get("key_lengths"), B, "key_lengths");
  mask.query_lengths = parse_lengths(get("query_lengths"), B, "query_lengths");

  if (const py::object keep = get("keep_mask"); !keep.is_none()) {
    if (!py::isinstance<py::array_t<bool>>(keep) && !py::isinstance<py::array_t<uint8_t>>(keep))
      throw py::type_error(
          "keep_mask must be a numpy bool (or uint8) array, True = may attend; pass an additive "
          "float mask as bias=");
    out.keep_owner = py::reinterpret_borrow<py::array>(keep);
    mask.keep = qkv::broadcast_mask(array_view<uint8_t>(out.keep_owner, "keep_mask"), B, H, N, M, "keep_mask");
  }
  if (const py::object bias = get("bias"); !bias.is_none()) {
    if (!py::isinstance<py::array_t<float>>(bias) && !py::isinstance<py::array_t<double>>(bias))
      throw py::type_error("bias must be a numpy float32 or float64 array (added to the scaled scores)");
    // float64 biases are rounded to float32 once, as every kernel reads float32 bias. A NaN or
    // +inf would make its whole row NaN; -inf masks the pair. The CLI's --bias has the same rule.
    const qkv::TensorView<const float> b = float32_view(bias, "bias", out.bias_owner);
    check_finite(b, "bias", /*allow_neg_inf=*/true);
    mask.bias = qkv::broadcast_mask(b, B, H, N, M, "bias");
  }
  if (const py::object slopes = get("alibi_slopes"); !slopes.is_none()) {
    if (!is_list_arg(slopes)) throw py::type_error("alibi_slopes must be a sequence of floats, one per query head");
    std::size_t i = 0;
    for (const py::handle s : slopes) {
      mask.alibi_slopes.push_back(qkv::alibi_slope_value(number_arg(s, fmt::format("alibi_slopes[{}]", i)), i));
      ++i;
    }
    qkv::check_alibi_count(mask.alibi_slopes.size(), H);
  }
  if (const py::object cap = get("softcap"); !cap.is_none())
    mask.softcap = qkv::softcap_value(number_arg(cap, "softcap"));
  return out;
}

qkv::Dropout dropout_arg(const py::dict& mask) {
  auto get = [&](const char* key) -> py::object {
    return mask.contains(key) ? py::reinterpret_borrow<py::object>(mask[key]) : py::none();
  };
  qkv::Dropout d;
  if (const py::object p = get("dropout_p"); !p.is_none()) d.p = qkv::dropout_p_value(number_arg(p, "dropout_p"));
  const py::object seed = get("dropout_seed");
  if (d.active() && seed.is_none())
    throw py::value_error("dropout_p > 0 needs seed= (an integer): the backward regenerates the same mask from it");
  if (!seed.is_none()) d.seed = seed_arg(seed, "seed");
  if (const py::object offset = get("dropout_offset"); !offset.is_none()) d.offset = seed_arg(offset, "dropout_offset");
  return d;
}

}  // namespace qkvpy
