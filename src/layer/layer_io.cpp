// MultiHeadAttention::save / load: safetensors with the config as metadata, or a directory of
// .npy files (one per tensor) with the same config as qkv_layer.json.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/mapped_file.h"
#include "io/strict_json.h"
#include "layer/layer_shapes.h"
#include "qkv/io.h"
#include "qkv/layer.h"

namespace qkv {
namespace {

constexpr const char* kFormatKey = "qkv.format";
constexpr const char* kFormat = "qkv.MultiHeadAttention/1";

// Metadata key qkv.<key> as an integer of type T: all of the value, in T's range.
template <class T>
T read_integer(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  const auto it = meta.find("qkv." + key);
  if (it == meta.end()) throw Error(fmt::format("{}: layer metadata has no qkv.{}", path, key));
  T value = 0;
  const char* end = it->second.data() + it->second.size();
  const auto [ptr, ec] = std::from_chars(it->second.data(), end, value);
  if (ec == std::errc::result_out_of_range && ptr == end)
    throw Error(fmt::format("{}: layer metadata qkv.{} = '{}' is out of range [{}, {}]", path, key, it->second,
                            std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
  if (ec != std::errc() || ptr != end)
    throw Error(fmt::format("{}: layer metadata qkv.{} = '{}' is not an integer", path, key, it->second));
  return value;
}

bool read_bool(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  const int64_t v = read_integer<int64_t>(meta, key, path);
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
      {"qkv.residual", c.residual ? "1" : "0"},
      {"qkv.note", c.note},
  };
}

// Reads the string map that save_npy_dir wrote as JSON; any other shape of JSON is refused.
std::map<std::string, std::string> read_npy_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kNpyConfigName).string();
  std::optional<detail::MappedFile> file;  // a device or FIFO is refused, not read forever
  try {
    file.emplace(path);
  } catch (const Error& e) {
    const std::string message = fmt::format("{}: cannot open the layer config (a .npy weights directory needs {}): {}",
                                            path, kNpyConfigName, e.what());
    if (const auto* file_error = dynamic_cast<const FileError*>(&e))
      throw FileError(message, file_error->errnum(), file_error->path());
    throw Error(message);
  }
  const nlohmann::json json = detail::parse_strict_json(file->bytes(), path, "the layer config");
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
    // Any entry by that name is read, so a broken link or an unreadable file gets load_npy's error.
    std::error_code ec;
    if (std::filesystem::symlink_status(file, ec).type() != std::filesystem::file_type::not_found)
      tensors.emplace(name, load_npy<float>(file.string()));
  }
  return tensors;
}

// The metadata is untrusted and the layer is allocated from it before its tensors are compared
// with their shapes, so first refuse a config that needs far more values than the file's tensors
// hold: more than twice as many plus 64 Ki (the slack lets a file missing a tensor or holding a
// misshapen one reach the messages that name it), so the allocation stays within about twice
// the file, as in the other readers. The defaults mirror LayerConfig's (0 means E / H, H and D);
// a parameter-free layer allocates nothing.
void check_config_fits_tensors(const LayerConfig& c, const TensorMap& tensors, const std::string& path) {
  if (c.parameter_free || c.embed_dim < 1 || c.num_heads < 1 || c.num_kv_heads < 0 || c.head_dim < 0 || c.value_dim < 0)
    return;  // the constructor refuses these with its own message
  using U = unsigned __int128;
  U held = 0;
  for (const auto& [name, t] : tensors) held += static_cast<U>(t.numel());
  const U limit = 2 * held + 65536;
  // Every value saturates at 2^62 (above any limit: held < 2^62), so no product of two overflows.
  auto cap = [](U v) { return std::min(v, U{1} << 62); };
  auto mul = [&](U a, U b, U d) { return cap(cap(a * b) * d); };
  const U E = cap(static_cast<U>(c.embed_dim)), H = cap(static_cast<U>(c.num_heads));
  const U Hkv = c.num_kv_heads > 0 ? cap(static_cast<U>(c.num_kv_heads)) : H;
  const U D = cap(static_cast<U>(c.head_dim > 0 ? c.head_dim : c.embed_dim / c.num_heads));
  const U Dv = c.value_dim > 0 ? cap(static_cast<U>(c.value_dim)) : D;
  const U weights = mul(E, H, D) + mul(E, Hkv, D) + mul(E, Hkv, Dv) + (c.output_projection ? mul(H, Dv, E) : 0);
  if (weights > limit)
    throw Error(
        fmt::format("{}: the layer config (embed_dim {}, num_heads {}, num_kv_heads {}, head_dim {}, value_dim "
                    "{}) needs at least {} weights, far more than the {} values the file's tensors hold",
                    path, c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.value_dim,
                    static_cast<uint64_t>(std::min<U>(weights, UINT64_MAX)), static_cast<uint64_t>(held)));
}

}  // namespace

std::map<std::string, std::string> MultiHeadAttention::metadata() const { return config_metadata(config_); }

std::vector<std::string> MultiHeadAttention::directory_files() {
  std::vector<std::string> files;
  for (const char* name : kParameterNames) files.push_back(std::string(name) + ".npy");
  files.emplace_back(kNpyConfigName);
  return files;
}

namespace {

void save_directory(const MultiHeadAttention& layer, const std::string& dir,
                    const std::map<std::string, std::string>& meta) {
  // A directory cannot be replaced in one step, so a directory with a config always holds that
  // config's layer, and one without is refused by load(): everything that can fail before a byte is
  // written is done first (the bytes, each target), the old config goes, the tensors are written
  // (each atomically) and the files of parameters this layer lacks removed, and the config goes last.
  auto in_dir = [&](const std::string& name) { return (std::filesystem::path(dir) / name).string(); };
  struct File {
    std::string path, bytes;
    OutputTarget target;
  };
  std::vector<File> files;
  for (const auto& [name, t] : layer.parameters())
    files.push_back({in_dir(name + ".npy"), npy_bytes<float>(t->view()), {}});
  files.push_back({in_dir(kNpyConfigName), nlohmann::json(meta).dump(2) + "\n", {}});
  for (File& f : files) f.target = resolve_output(f.path);
  auto remove = [](const std::string& file) {
    std::error_code gone;
    if (!std::filesystem::remove(file, gone) && gone)
      throw Error(fmt::format("cannot remove {}: {}", file, gone.message()));
  };
  remove(files.back().path);
  for (std::size_t i = 0; i + 1 < files.size(); ++i) write_output(files[i].path, files[i].target, files[i].bytes);
  for (const char* name : kParameterNames)
    if (std::none_of(files.begin(), files.end(),
                     [&](const File& f) { return f.path == in_dir(name + std::string(".npy")); }))
      remove(in_dir(name + std::string(".npy")));
  // Resolved again: the config removed may have been a link, which now names nothing.
  write_output(files.back().path, resolve_output(files.back().path), files.back().bytes);
}

}  // namespace

void MultiHeadAttention::save(const std::string& path) const {
  detail::check_parameter_shapes(*this, fmt::format("{}: not saved", path));
  for (const auto& [name, t] : parameters())
    for (int64_t i = 0; i < t->numel(); ++i)
      if (!std::isfinite((*t)[i]))
        throw Error(fmt::format("{}: not saved: weight {} has a non-finite value ({}) at flat index {}", path, name,
                                (*t)[i], i));
  const std::map<std::string, std::string> meta = config_metadata(config_);
  std::error_code ec;  // not a directory, or no status at all: the file's writer names the fault
  if (std::filesystem::is_directory(path, ec)) {
    save_directory(*this, path, meta);
    return;
  }
  std::vector<std::pair<std::string, TensorView<const float>>> tensors;
  for (const auto& [name, t] : parameters()) tensors.emplace_back(name, t->view());
  save_safetensors(path, tensors, meta);
}

MultiHeadAttention MultiHeadAttention::load(const std::string& path) {
  std::map<std::string, std::string> meta;
  TensorMap tensors;
  std::error_code ec;  // not a directory, or no status at all: the file's reader names the fault
  if (std::filesystem::is_directory(path, ec)) {
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
  c.embed_dim = read_integer<int64_t>(meta, "embed_dim", path);
  c.num_heads = read_integer<int64_t>(meta, "num_heads", path);
  c.num_kv_heads = read_integer<int64_t>(meta, "num_kv_heads", path);
  c.head_dim = read_integer<int64_t>(meta, "head_dim", path);
  c.value_dim = read_integer<int64_t>(meta, "value_dim", path);
  c.bias = read_bool(meta, "bias", path);
  c.output_projection = read_bool(meta, "output_projection", path);
  c.parameter_free = read_bool(meta, "parameter_free", path);
  if (meta.count("qkv.seed") > 0) c.seed = read_integer<decltype(c.seed)>(meta, "seed", path);
  // Files written before these keys existed are residual-free and have no note.
  if (meta.count("qkv.residual") > 0) c.residual = read_bool(meta, "residual", path);
  if (const auto note = meta.find("qkv.note"); note != meta.end()) c.note = note->second;
  check_config_fits_tensors(c, tensors, path);
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
      if (!std::isfinite(src[i]))
        throw Error(fmt::format("{}: tensor {} has a non-finite value at flat index {}", path, name, i));
      (*dst)[i] = src[i];
    }
  }
  return layer;
}

}  // namespace qkv
