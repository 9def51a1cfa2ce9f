// MultiHeadAttention::save / load: safetensors with the config as metadata.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "qkv/io.h"
#include "qkv/layer.h"

namespace qkv {
namespace {

constexpr const char* kFormatKey = "qkv.format";
constexpr const char* kFormat = "qkv.MultiHeadAttention/1";

int64_t read_int(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  const auto it = meta.find("qkv." + key);
  if (it == meta.end()) throw Error(fmt::format("{}: layer metadata has no qkv.{}", path, key));
  int64_t value = 0;
  const char* end = it->second.data() + it->second.size();
  const auto [ptr, ec] = std::from_chars(it->second.data(), end, value);
  if (ec != std::errc() || ptr != end)
    throw Error(fmt::format("{}: layer metadata qkv.{} = '{}' is not an integer", path, key, it->second));
  return value;
}

bool read_bool(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  const int64_t v = read_int(meta, key, path);
  if (v != 0 && v != 1) throw Error(fmt::format("{}: layer metadata qkv.{} = {} must be 0 or 1", path, key, v));
  return v == 1;
}

}  // namespace

void MultiHeadAttention::save(const std::string& path) const {
  const LayerConfig& c = config_;
  std::map<std::string, std::string> meta{
      {kFormatKey, kFormat},
      {"qkv.embed_dim", std::to_string(c.embed_dim)},
      {"qkv.num_heads", std::to_string(c.num_heads)},
      {"qkv.num_kv_heads", std::to_string(c.num_kv_heads)},
      {"qkv.head_dim", std::to_string(c.head_dim)},
      {"qkv.value_dim", std::to_string(c.value_dim)},
      {"qkv.bias", c.bias ? "1" : "0"},
      {"qkv.output_projection", c.output_projection ? "1" : "0"},
      {"qkv.parameter_free", c.parameter_free ? "1" : "0"},
      {"qkv.seed", std::to_string(c.seed)},
  };
  std::vector<std::pair<std::string, TensorView<const float>>> tensors;
  for (const auto& [name, t] : parameters()) tensors.emplace_back(name, t->view());
  save_safetensors(path, tensors, meta);
}

MultiHeadAttention MultiHeadAttention::load(const std::string& path) {
  std::map<std::string, std::string> meta;
  TensorMap tensors = load_safetensors(path, &meta);
  const auto format = meta.find(kFormatKey);
  if (format == meta.end())
    throw Error(fmt::format("{}: not a qkv layer file (no {} in the safetensors metadata)", path, kFormatKey));
  if (format->second != kFormat)
    throw Error(fmt::format("{}: unsupported layer format '{}' (expected '{}')", path, format->second, kFormat));
  LayerConfig c;
  c.embed_dim = read_int(meta, "embed_dim", path);
  c.num_heads = read_int(meta, "num_heads", path);
  c.num_kv_heads = read_int(meta, "num_kv_heads", path);
  c.head_dim = read_int(meta, "head_dim", path);
  c.value_dim = read_int(meta, "value_dim", path);
  c.bias = read_bool(meta, "bias", path);
  c.output_projection = read_bool(meta, "output_projection", path);
  c.parameter_free = read_bool(meta, "parameter_free", path);
  if (const auto seed = meta.find("qkv.seed"); seed != meta.end()) c.seed = std::strtoull(seed->second.c_str(), nullptr, 10);
  MultiHeadAttention layer = [&] {
    try {
      return MultiHeadAttention(c);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: bad layer config: {}", path, e.what()));
    }
  }();

  auto params = layer.parameters();
  for (const char* name : {"w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"}) {
    const bool wanted = std::any_of(params.begin(), params.end(), [&](const auto& p) { return p.first == name; });
    if (!wanted && tensors.count(name))
      throw Error(fmt::format("{}: tensor {} is present but the layer config has no such parameter", path, name));
  }
  for (auto& [name, dst] : params) {
    const auto it = tensors.find(name);
    if (it == tensors.end())
      throw Error(fmt::format("{}: missing tensor {} (expected shape {})", path, name, shape_string(dst->shape())));
    const Tensor<float>& src = it->second;
    if (!std::equal(src.shape().begin(), src.shape().end(), dst->shape().begin(), dst->shape().end()))
      throw Error(fmt::format("{}: tensor {} has shape {} but the config needs {}", path, name,
                              shape_string(src.shape()), shape_string(dst->shape())));
    for (int64_t i = 0; i < src.numel(); ++i) {
      if (!std::isfinite(src[i])) throw Error(fmt::format("{}: tensor {} has a non-finite value at flat index {}", path, name, i));
      (*dst)[i] = src[i];
    }
  }
  return layer;
}

}  // namespace qkv
