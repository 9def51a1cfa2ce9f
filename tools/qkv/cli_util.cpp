// Shared CLI helpers: finiteness checks, output paths and all-or-nothing outputs.
#include "cli_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <memory>
#include <map>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "qkv/atomic_file.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/output_file.h"

namespace qkv::cli {

void usage_error(const std::string& message) { throw CLI::ValidationError(message); }

void print_to_stderr(std::string_view text) noexcept {
  (void)std::fwrite(text.data(), 1, text.size(), stderr);
  (void)std::fflush(stderr);
}

void print_error(std::string_view message) {
  try {
    print_to_stderr(fmt::format("qkv: error: {}\n", message));
  } catch (...) {  // no memory to format: the message alone
    print_to_stderr(message);
  }
}

template <class T>
void check_finite(TensorView<const T> t, const std::string& name, bool allow_neg_inf, const IndexMap& to_file_index) {
  std::optional<NonFinite> bad = find_non_finite(t, allow_neg_inf);
  if (!bad) return;
  if (to_file_index) to_file_index(bad->index);
  const char* what = std::isnan(bad->value) ? "NaN" : (bad->value > 0 ? "+Inf" : "-Inf");
  throw Error(fmt::format("{}: element {} is {}", name, shape_string(bad->index), what));
}
template void check_finite<float>(TensorView<const float>, const std::string&, bool, const IndexMap&);
template void check_finite<double>(TensorView<const double>, const std::string&, bool, const IndexMap&);

OutputTarget check_output_path(const std::string& path, const std::string& option) {
  try {
    return resolve_output(path);
  } catch (const Error& e) {
    // "cannot write X: why" -> "--out X: why", the option being what the user typed.
    std::string message = e.what();
    const std::string prefix = "cannot write ";
    if (message.rfind(prefix, 0) == 0)
      message.replace(0, prefix.size(), option + " ");
    else
      message = option + ": " + message;
    throw Error(message);
  }
}

namespace {

std::string file_identity(const struct stat& st) { return fmt::format("inode {}:{}", st.st_dev, st.st_ino); }

// What an output name ends up writing, so that two spellings of one file compare equal: a file
// that exists (or a descriptor open on one) by device and inode, which also catches hard links;
// a new file by its directory's device and inode (a path would miss a bind mount) and its name;
// anything else by the path it resolves to.
std::string output_identity(const OutputTarget& t) {
  struct stat st {};
  const bool on_file = t.kind == OutputKind::descriptor ? ::fstat(t.fd, &st) == 0 && S_ISREG(st.st_mode)
                                                        : t.exists && ::stat(t.resolved.c_str(), &st) == 0;
  if (on_file) return file_identity(st);
  if (t.kind == OutputKind::descriptor) return fmt::format("descriptor {}", t.fd);
  if (t.kind == OutputKind::device) return "device " + t.resolved;
  const std::filesystem::path path(t.resolved);
  const std::string dir = path.has_parent_path() ? path.parent_path().string() : ".";
  if (::stat(dir.c_str(), &st) != 0) return "new " + t.resolved;  // resolve_output checked it is there
  return fmt::format("new {}:{}/{}", st.st_dev, st.st_ino, path.filename().string());
}

// An input's identity as output_identity gives it for an existing file; "" when the path names no
// regular file (its reader reports that).
std::string input_identity(const std::string& path) {
  struct stat st {};
  if (path.empty() || path == "-" || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  return file_identity(st);
}

}  // namespace

void check_output_paths(const std::vector<std::pair<std::string, std::string>>& outputs,
                        const std::vector<std::pair<std::string, std::string>>& inputs) {
  std::map<std::string, std::pair<std::string, std::string>> read;  // identity -> (option, path)
  for (const auto& [option, path] : inputs)
    if (std::string id = input_identity(path); !id.empty()) read.emplace(std::move(id), std::pair{option, path});
  std::map<std::string, std::pair<std::string, std::string>> seen;  // identity -> (option, path)
  for (const auto& [option, path] : outputs) {
    if (path.empty()) continue;
    const std::string id = output_identity(check_output_path(path, option));
    if (const auto in = read.find(id); in != read.end())
      throw Error(fmt::format("{} {}: the same file as {} {}, which this command reads; name another file for {}",
                              option, path, in->second.first, in->second.second, option));
    const auto [it, fresh] = seen.emplace(id, std::pair{option, path});
    if (!fresh) {
      const auto& [first_option, first_path] = it->second;
      const std::string same = first_path == path ? fmt::format(" (and for {})", first_option)
                                                  : fmt::format(" ({} {} is the same file)", first_option, first_path);
      throw Error(fmt::format("{} {}: named for two outputs{}; each output needs its own file", option, path, same));
    }
  }
}

void write_outputs(const std::vector<std::pair<std::string, std::string>>& files) {
  std::set<std::string> seen;
  for (const auto& f : files)
    if (!seen.insert(output_identity(resolve_output(f.first))).second)
      throw Error(fmt::format("{}: named for two outputs", f.first));
  write_files_atomically(files);
}

void write_stdout(std::string_view bytes) {
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    throw Error(fmt::format("cannot write to standard output: {}", std::strerror(errno)));
}

void on_parse_complete(CLI::App* app, std::function<void()> check) {
  static std::map<CLI::App*, std::shared_ptr<std::vector<std::function<void()>>>> checks;
  std::shared_ptr<std::vector<std::function<void()>>>& list = checks[app];
  if (!list) {
    list = std::make_shared<std::vector<std::function<void()>>>();
    app->parse_complete_callback([all = list] {
      for (const std::function<void()>& f : *all) f();
    });
  }
  list->push_back(std::move(check));
}

}  // namespace qkv::cli
