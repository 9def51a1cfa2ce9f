// MultiHeadAttention::save / load: safetensors with the config as metadata, or a directory of
// .npy files (one per tensor) with the same config as qkv_layer.json.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

constexpr const char* kNpyConfigName = "qkv_layer.json";
constexpr const char* kParameterNames[] = {"w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"};

std::map<std::string, std::string> config_metadata(const LayerConfig& c) {
  return {
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
}

// Reads the string map that save_npy_dir wrote as JSON; any other shape of JSON is refused.
std::map<std::string, std::string> read_npy_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kNpyConfigName).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open the layer config (a .npy weights directory needs {})", path, kNpyConfigName));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) throw Error(fmt::format("{}: not a JSON object of strings", path));
  std::map<std::string, std::string> meta;
  for (const auto& [key, value] : json.items()) {
    if (!value.is_string()) throw Error(fmt::format("{}: value of '{}' is not a string", path, key));
    meta[key] = value.get<std::string>();
  }
  return meta;
}

TensorMap read_npy_tensors(const std::string& dir) {
  TensorMap tensors;
  for (const char* name : kParameterNames) {
    const std::filesystem::path file = std::filesystem::path(dir) / (std::string(name) + ".npy");
    if (std::filesystem::exists(file)) tensors.emplace(name, load_npy<float>(file.string()));
  }
  return tensors;
}

}  // namespace

void MultiHeadAttention::save(const std::string& path) const {
  const std::map<std::string, std::string> meta = config_metadata(config_);
  if (std::filesystem::is_directory(path)) {
    // One .npy per tensor, each written atomically; the config goes last so a directory with a
    // config always has its tensors.
    for (const auto& [name, t] : parameters())
      save_npy<float>((std::filesystem::path(path) / (name + ".npy")).string(), t->view());
    write_file_atomically((std::filesystem::path(path) / kNpyConfigName).string(), nlohmann::json(meta).dump(2) + "\n");
    return;
  }
  std::vector<std::pair<std::string, TensorView<const float>>> tensors;
  for (const auto& [name, t] : parameters()) tensors.emplace_back(name, t->view());
  save_safetensors(path, tensors, meta);
}

MultiHeadAttention MultiHeadAttention::load(const std::string& path) {
  std::map<std::string, std::string> meta;
  TensorMap tensors;
  if (std::filesystem::is_directory(path)) {
    meta = read_npy_config(path);
    tensors = read_npy_tensors(path);
  } else {
    tensors = load_safetensors(path, &meta);
  }
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
  for (const char* name : kParameterNames) {
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
