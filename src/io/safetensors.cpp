// .safetensors: an 8-byte little-endian header length N, N bytes of JSON describing each tensor
// (dtype, shape, data_offsets relative to the buffer), then the byte buffer.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/half.h"
#include "io/mapped_file.h"
#include "io/safetensors_bytes.h"
#include "io/strict_json.h"
#include "qkv/error.h"
#include "qkv/out_of_memory.h"
#include "qkv/atomic_file.h"
#include "qkv/safetensors.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

enum class StType { f64, f32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8, boolean, unsupported };

struct StDtype {
  std::string_view name;
  StType type;
  std::size_t size;
};

constexpr StDtype kDtypes[] = {
    {"F64", StType::f64, 8},
    {"F32", StType::f32, 4},
    {"F16", StType::f16, 2},
    {"BF16", StType::bf16, 2},
    {"I64", StType::i64, 8},
    {"I32", StType::i32, 4},
    {"I16", StType::i16, 2},
    {"I8", StType::i8, 1},
    {"U64", StType::u64, 8},
    {"U32", StType::u32, 4},
    {"U16", StType::u16, 2},
    {"U8", StType::u8, 1},
    {"BOOL", StType::boolean, 1},
    {"F8_E4M3", StType::unsupported, 1},
    {"F8_E5M2", StType::unsupported, 1},
};

struct Entry {
  std::string name;
  StDtype dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

template <class S>
S load_le(const char* p) {
  S s;
  std::memcpy(&s, p, sizeof s);
  return s;
}

float element_to_float(const char* p, StType type, const std::string& where, uint64_t index) {
  switch (type) {
    case StType::f32:
      return load_le<float>(p);
    case StType::f64: {
      double v = load_le<double>(p);
      float f = static_cast<float>(v);
      if (overflows_float32(v)) throw Error(fmt::format("{}: element {} ({}) overflows float32", where, index, v));
      return f;
    }
    case StType::f16:
      return detail::half_to_float(load_le<uint16_t>(p));
    case StType::bf16:
      return bf16_to_float(bf16{load_le<uint16_t>(p)});
    case StType::i64:
      return static_cast<float>(load_le<int64_t>(p));
    case StType::i32:
      return static_cast<float>(load_le<int32_t>(p));
    case StType::i16:
      return static_cast<float>(load_le<int16_t>(p));
    case StType::i8:
      return static_cast<float>(load_le<int8_t>(p));
    case StType::u64:
      return static_cast<float>(load_le<uint64_t>(p));
    case StType::u32:
      return static_cast<float>(load_le<uint32_t>(p));
    case StType::u16:
      return static_cast<float>(load_le<uint16_t>(p));
    case StType::u8:
      return static_cast<float>(load_le<uint8_t>(p));
    case StType::boolean:
      return *p != 0 ? 1.0f : 0.0f;
    case StType::unsupported:
      break;
  }
  throw Error(fmt::format("{}: unsupported dtype", where));
}

uint64_t get_unsigned(const json& v, const std::string& where, const char* what) {
  // The parser keeps non-negative integers unsigned, so a signed 0 was written "-0" (which dump()
  // prints as 0).
  if (!v.is_number_unsigned())
    throw Error(fmt::format("{}: {} must be non-negative integers, got {}", where, what,
                            v.is_number_integer() && v.get<int64_t>() == 0 ? "-0" : v.dump()));
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const json& desc, const std::string& path) {
  const std::string where = fmt::format("{}: tensor {}", path, detail::quoted(name));
  if (!desc.is_object()) throw Error(fmt::format("{}: the description is not a JSON object", where));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!desc.contains(key)) throw Error(fmt::format("{}: the key \"{}\" is missing", where, key));
  Entry e;
  e.name = name;
  const json& dtype = desc["dtype"];
  if (!dtype.is_string()) throw Error(fmt::format("{}: dtype is not a string", where));
  auto found = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                            [&](const StDtype& d) { return d.name == dtype.get_ref<const std::string&>(); });
  if (found == std::end(kDtypes))
    throw Error(fmt::format("{}: unknown dtype {}", where, detail::quoted(dtype.get_ref<const std::string&>())));
  if (found->type == StType::unsupported)
    throw Error(fmt::format("{}: dtype {} is not supported (supported: F32, F64, F16, BF16, integers, BOOL)", where,
                            found->name));
  e.dtype = *found;

  const json& shape = desc["shape"];
  if (!shape.is_array()) throw Error(fmt::format("{}: shape is not an array", where));
  if (shape.size() > 4)
    throw Error(fmt::format("{}: rank {} (shape {}); qkv supports rank 0 to 4", where, shape.size(), shape.dump()));
  unsigned __int128 bytes = e.dtype.size;
  for (const json& d : shape) {
    uint64_t n = get_unsigned(d, where, "shape entries");
    if (n > static_cast<uint64_t>(INT64_MAX))
      throw Error(fmt::format("{}: shape {} is too large", where, shape.dump()));
    e.shape.push_back(static_cast<int64_t>(n));
    bytes *= n;
    if (bytes > UINT64_MAX) throw Error(fmt::format("{}: shape {} is too large to address", where, shape.dump()));
  }

  const json& offsets = desc["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    throw Error(fmt::format("{}: data_offsets must be [begin, end], got {}", where, offsets.dump()));
  e.begin = get_unsigned(offsets[0], where, "data_offsets");
  e.end = get_unsigned(offsets[1], where, "data_offsets");
  if (e.end < e.begin)
    throw Error(fmt::format("{}: data_offsets [{}, {}] end before they begin", where, e.begin, e.end));
  if (static_cast<uint64_t>(bytes) != e.end - e.begin)
    throw Error(fmt::format("{}: shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}", where,
                            shape_string(e.shape), e.dtype.name, static_cast<uint64_t>(bytes), e.begin, e.end,
                            e.end - e.begin));
  return e;
}

}  // namespace

TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  detail::MappedFile file(path);
  if (file.size() < 8)
    throw Error(fmt::format("{}: not a safetensors file ({} bytes, too short for the 8-byte header length)", path,
                            file.size()));
  const uint64_t header_len = load_le<uint64_t>(file.data());
  if (header_len > file.size() - 8)
    throw Error(fmt::format("{}: truncated safetensors file: the header length is {} bytes but the file holds {}", path,
                            header_len, file.size() - 8));
  if (header_len > kMaxHeaderBytes)
    throw Error(fmt::format("{}: the safetensors header length {} exceeds the {} byte limit", path, header_len,
                            kMaxHeaderBytes));
  const std::string_view text(file.data() + 8, header_len);
  // The format says the header begins with '{'. A UTF-8 byte-order mark, which nlohmann skips,
  // is refused, as the reference reader (the safetensors crate, through serde_json) refuses it.
  if (text.starts_with("\xEF\xBB\xBF"))
    throw Error(
        fmt::format("{}: the safetensors header starts with a UTF-8 byte-order mark (EF BB BF); the format "
                    "has the JSON start with '{{'",
                    path));
  json header = detail::parse_strict_json(text, path, "the safetensors header");
  if (!header.is_object()) throw Error(fmt::format("{}: the safetensors header is not a JSON object", path));

  const char* buffer = file.data() + 8 + header_len;
  const uint64_t buffer_size = file.size() - 8 - header_len;
  std::vector<Entry> entries;
  std::map<std::string, std::string> meta;
  for (const auto& [name, desc] : header.items()) {
    if (name == "__metadata__") {
      if (!desc.is_object()) throw Error(fmt::format("{}: __metadata__ is not a JSON object", path));
      for (const auto& [key, value] : desc.items()) {
        if (!value.is_string())
          throw Error(fmt::format("{}: __metadata__ value of {} is not a string", path, detail::quoted(key)));
        meta[key] = value.get<std::string>();
      }
      continue;
    }
    Entry e = parse_entry(name, desc, path);
    if (e.end > buffer_size)
      throw Error(fmt::format("{}: tensor {}: data_offsets [{}, {}] run past the end of the {}-byte data buffer", path,
                              detail::quoted(name), e.begin, e.end, buffer_size));
    entries.push_back(std::move(e));
  }

  // The tensors must tile the buffer exactly: no overlap (two names for the same bytes) and no gap.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : by_offset) {
    if (e->begin < cursor)
      throw Error(fmt::format("{}: tensors {} and {} overlap (data_offsets [{}, {}] and [{}, {}])", path,
                              detail::quoted(previous->name), detail::quoted(e->name), previous->begin, previous->end,
                              e->begin, e->end));
    if (e->begin > cursor)
      throw Error(fmt::format("{}: bytes {} to {} of the data buffer belong to no tensor (before tensor {})", path,
                              cursor, e->begin, detail::quoted(e->name)));
    cursor = e->end;
    previous = e;
  }
  if (cursor != buffer_size)
    throw Error(fmt::format("{}: the data buffer holds {} bytes but the tensors cover {} (trailing bytes)", path,
                            buffer_size, cursor));

  // The offsets are bounded by the file; the float32 tensors may be up to 4x that (U8, BOOL).
  unsigned __int128 need = 0;
  for (const Entry& e : entries)
    need += static_cast<unsigned __int128>((e.end - e.begin) / e.dtype.size) * sizeof(float);
  detail::check_fits_in_memory(need, path);
  TensorMap out;
  for (const Entry& e : entries) {
    const std::string where = fmt::format("{}: tensor {}", path, detail::quoted(e.name));
    Tensor<float> t(std::span<const int64_t>(e.shape), where);
    const char* src = buffer + e.begin;
    if (e.dtype.type == StType::f32) {
      if (t.numel() > 0) std::memcpy(t.data(), src, static_cast<std::size_t>(t.numel()) * sizeof(float));
    } else {
      for (int64_t i = 0; i < t.numel(); ++i)
        t[i] = element_to_float(src + static_cast<uint64_t>(i) * e.dtype.size, e.dtype.type, where, i);
    }
    out.insert_or_assign(e.name, std::move(t));
  }
  if (metadata != nullptr) *metadata = std::move(meta);
  return out;
}

namespace {

// A file's header (padded) and its tensors in name order: everything a writer refuses, refused.
struct Header {
  std::string text;
  std::map<std::string, TensorView<const float>> sorted;
  uint64_t data_bytes = 0;
};

Header build_header(const std::string& path,
                    const std::vector<std::pair<std::string, TensorView<const float>>>& tensors,
                    const std::map<std::string, std::string>& metadata) {
  Header h;
  for (const auto& [name, view] : tensors) {
    if (name == "__metadata__")
      throw Error(fmt::format("cannot write {}: \"__metadata__\" is not a tensor name", path));
    // A negative dimension wrote "shape": [-1, 3] and offsets near 2^64, which no reader takes.
    checked_numel(view.shape(), sizeof(float), fmt::format("cannot write {}: tensor {}", path, detail::quoted(name)));
    if (view.numel() > 0 && view.data() == nullptr)
      throw Error(fmt::format("cannot write {}: tensor {} has no data", path, detail::quoted(name)));
    if (!h.sorted.emplace(name, view).second)
      throw Error(fmt::format("cannot write {}: the tensor name {} is given twice", path, detail::quoted(name)));
  }
  json header = json::object();
  for (const auto& [name, view] : h.sorted) {
    uint64_t bytes = static_cast<uint64_t>(view.numel()) * sizeof(float);
    header[name] = {{"dtype", "F32"},
                    {"shape", std::vector<int64_t>(view.shape().begin(), view.shape().end())},
                    {"data_offsets", {h.data_bytes, h.data_bytes + bytes}}};
    h.data_bytes += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  try {
    h.text = header.dump();
  } catch (const json::exception& e) {
    throw Error(fmt::format("cannot write {}: a name or metadata string is not valid UTF-8 ({})", path, e.what()));
  }
  // Pad the header with spaces to a multiple of 8 so the buffer is aligned, as the reference writer does.
  h.text.append((8 - h.text.size() % 8) % 8, ' ');
  return h;
}

}  // namespace

void detail::check_safetensors(const std::string& path,
                               const std::vector<std::pair<std::string, TensorView<const float>>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  build_header(path, tensors, metadata);
}

std::string detail::safetensors_bytes(const std::string& path,
                                      const std::vector<std::pair<std::string, TensorView<const float>>>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  const Header h = build_header(path, tensors, metadata);
  // A broadcast view of 2^40 elements is a valid view: its bytes are refused by name, not left to
  // std::bad_alloc (or a sanitizer's abort).
  const uint64_t total = 8 + h.text.size() + h.data_bytes;
  detail::check_fits_in_memory(total, fmt::format("cannot write {}", path));
  std::string out;
  try {
    out.reserve(total);
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(fmt::format("cannot write {}", path), total);
  }
  const uint64_t header_len = h.text.size();
  out.append(reinterpret_cast<const char*>(&header_len), 8);
  out += h.text;
  for (const auto& [name, view] : h.sorted) {
    if (view.numel() == 0) continue;
    for_each_element(view,
                     [&out](const float& x, const auto&) { out.append(reinterpret_cast<const char*>(&x), sizeof x); });
  }
  return out;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, TensorView<const float>>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_file_atomically(path, detail::safetensors_bytes(path, tensors, metadata));
}

}  // namespace qkv
