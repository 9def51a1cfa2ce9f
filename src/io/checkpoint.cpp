#include "qkv/checkpoint.h"
#include "qkv/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "io/atomic_replace.h"
#include "io/safetensors_bytes.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/output_file.h"

namespace qkv {
namespace {

// FNV-1a, 64 bit: small, dependency-free, and catches flipped and truncated bytes.
class Fnv1a {
 public:
  void bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) {
      hash_ ^= p[i];
      hash_ *= 0x100000001b3ULL;
    }
  }
  void text(const std::string& s) { bytes(s.data(), s.size() + 1); }  // with its terminator
  void int64(int64_t v) { bytes(&v, sizeof v); }
  std::string hex() const { return fmt::format("{:016x}", hash_); }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

using NamedView = std::pair<std::string, TensorView<const float>>;

std::string checksum(std::vector<NamedView> tensors, const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const NamedView& a, const NamedView& b) { return a.first < b.first; });
  Fnv1a h;
  for (const auto& [name, view] : tensors) {
    h.text(name);
    h.int64(view.rank());
    for (int64_t d : view.shape()) h.int64(d);
    for_each_element(view, [&h](const float& x, const auto&) { h.bytes(&x, sizeof x); });
  }
  for (const auto& [key, value] : metadata) {
    if (key == kChecksumKey) continue;
    h.text(key);
    h.text(value);
  }
  return h.hex();
}

// The name the checkpoint `resolved` (a file, after links) is kept under when it is replaced, if
// that name can take it: a rename replaces a file or a link, never a directory, and anything else
// there is not a checkpoint of ours to replace.
std::string previous_name(const std::string& path, const std::string& resolved) {
  const std::string prev = resolved + ".prev";
  struct stat st {};
  if (::lstat(prev.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return prev;
  throw Error(fmt::format("checkpoint {}: the previous one cannot be kept as {}: it is {} (remove or rename it)", path,
                          prev, S_ISDIR(st.st_mode) ? "a directory" : "not a regular file"));
}

// Keeps the current checkpoint as `prev`: link (or copy) to a temporary name, then rename, so
// prev is always either the old previous checkpoint or the complete current one.
void keep_previous(const std::string& path, const std::string& prev) {
  namespace fs = std::filesystem;
  std::error_code ec;
  detail::remove_stale_temporaries(prev);
  if (!fs::is_regular_file(path, ec)) return;
  const std::string tmp = detail::temporary_name(prev);
  if (::link(path.c_str(), tmp.c_str()) != 0) {
    fs::copy_file(path, tmp, fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error(fmt::format("cannot keep the previous checkpoint {} as {}: {}", path, prev, ec.message()));
  }
  fs::rename(tmp, prev, ec);
  // A run killed between this rename and the checkpoint's own left path.prev a second link to
  // path; renaming a link onto another link of the same file does nothing (POSIX) and keeps tmp.
  std::error_code ignored;
  fs::remove(tmp, ignored);
  if (ec) throw Error(fmt::format("cannot keep the previous checkpoint {} as {}: {}", path, prev, ec.message()));
}

std::string prev_hint(const std::string& path) {
  std::error_code ec;
  const std::string prev = path + ".prev";
  return std::filesystem::is_regular_file(prev, ec) ? fmt::format(" (the previous checkpoint {} is still there)", prev)
                                                    : std::string();
}

}  // namespace

void check_checkpoint_path(const std::string& path) {
  const OutputTarget target = resolve_output(path);
  if (target.kind == OutputKind::file) previous_name(path, target.resolved);
}

void save_checkpoint(const std::string& path, const std::vector<NamedView>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  // Every refusal comes before the previous checkpoint is replaced by the current one: the bytes
  // first (names, metadata, shapes, data), then the checksum over them. The header is built again
  // with the checksum in its metadata.
  detail::check_safetensors(path, tensors, metadata);
  std::map<std::string, std::string> meta = metadata;
  meta[kChecksumKey] = checksum(tensors, metadata);
  const std::string bytes = detail::safetensors_bytes(path, tensors, meta);
  // The previous checkpoint is kept beside the file a symlink points to; a device keeps none.
  const OutputTarget target = resolve_output(path);
  if (target.kind == OutputKind::file) keep_previous(target.resolved, previous_name(path, target.resolved));
  write_output(path, target, bytes);
}

Checkpoint load_checkpoint(const std::string& path) {
  Checkpoint c;
  try {
    c.tensors = load_safetensors(path, &c.metadata);
  } catch (const Error& e) {
    throw Error(fmt::format("checkpoint {} is unreadable: {}{}", path, e.what(), prev_hint(path)));
  }
  const auto it = c.metadata.find(kChecksumKey);
  if (it == c.metadata.end())
    throw Error(fmt::format("checkpoint {} has no {} entry; it is not a qkv checkpoint{}", path, kChecksumKey,
                            prev_hint(path)));
  const std::string stored = it->second;
  c.metadata.erase(it);
  std::vector<NamedView> views;
  for (const auto& [name, t] : c.tensors) views.emplace_back(name, t.view());
  const std::string actual = checksum(views, c.metadata);
  if (actual != stored)
    throw Error(fmt::format("checkpoint {} is corrupted: checksum {} does not match the stored {}{}", path, actual,
                            stored, prev_hint(path)));
  return c;
}

}  // namespace qkv
