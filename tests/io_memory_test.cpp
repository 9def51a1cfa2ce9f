// Declared sizes that the file backs (sparse files consistent with their headers) but that exceed
// the machine's physical memory: every reader refuses them with one line naming the file and the
// sizes, before allocating. The sizes are taken from sysconf(_SC_PHYS_PAGES) at run time. The
// cases include the ones where the result is larger than the file: uint8 data read as float or
// double, and word2vec binary whose per-word bookkeeping outweighs a one-float vector.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "capped_memory.h"
#include "io_test_util.h"
#include "qkv/embeddings.h"
#include "qkv/io.h"
#include "qkv/layer.h"

namespace qkv {
namespace {

uint64_t physical_memory() {
  return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

std::string safetensors_header(const std::string& dtype, uint64_t n, uint64_t bytes) {
  std::string json = fmt::format(R"({{"t":{{"dtype":"{}","shape":[{}],"data_offsets":[0,{}]}}}})", dtype, n, bytes);
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[static_cast<std::size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return head + json;
}

struct Case {
  std::string name, head;
  uint64_t file_size;
  std::function<void(const std::string&)> load;
  uint64_t need;  // the bytes the message must state
};

TEST(IoMemory, SparseFilesDeclaringMoreThanPhysicalMemoryAreRefusedClearly) {
  const uint64_t ram = physical_memory();
  const uint64_t n = ram / 4 + (uint64_t{1} << 28);  // float32 values: RAM + 1 GiB
  const uint64_t bytes_n = ram / 2;                  // uint8 values read as float32: 2x RAM
  // One-float word2vec words: 180 bytes each (the value, a std::string, two lookup-table entries).
  const uint64_t words = ram / 160 + 1;
  const std::vector<Case> cases = {
      {"f4.npy", test::npy_header("<f4", fmt::format("({},)", n)), 4 * n,
       [](const std::string& p) { load_npy<float>(p); }, 4 * n},
      {"u1_as_double.npy", test::npy_header("|u1", fmt::format("({},)", n / 2)), n / 2,
       [](const std::string& p) { load_npy<double>(p); }, 4 * n},
      {"f32.safetensors", safetensors_header("F32", n, 4 * n), 4 * n, [](const std::string& p) { load_safetensors(p); },
       4 * n},
      {"u8.safetensors", safetensors_header("U8", bytes_n, bytes_n), bytes_n,
       [](const std::string& p) { load_safetensors(p); }, 4 * bytes_n},
      {"w2v.bin", fmt::format("{} 1\n", words), 6 * words, [](const std::string& p) { Embeddings::load(p); },
       words * 180},
  };
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = ::testing::TempDir() + fmt::format("qkv_io_memory_{}_{}", ::getpid(), c.name);
    test::write_raw(path, c.head);
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(c.head.size() + c.file_size)), 0) << path;  // sparse
    const uint64_t cap = c.head.size() + c.file_size + (uint64_t{4} << 30);  // the mapping plus 4 GiB
    const std::string pattern = fmt::format(
        "qkv_io_memory_.*{}: needs {} bytes \\(.* GiB\\) of memory, more than the {} "
        "bytes \\(.* GiB\\) of physical memory on this machine",
        c.name, c.need, ram);
    EXPECT_EXIT(test::load_with_capped_memory([&] { c.load(path); }, cap, path), ::testing::ExitedWithCode(0), pattern);
    std::remove(path.c_str());
  }
}

// A layer file's metadata sizes the layer before its tensors are compared with the shapes, so a
// config needing far more weights than the file holds is refused first: without that check,
// embed_dim = head_dim = 4096 would allocate and fill 4 x [4096, 8192] floats (0.5 GB) before
// the shape mismatch, and a config between free and total memory could take the machine down.
TEST(IoMemory, LayerConfigNeedingFarMoreWeightsThanTheFileIsRefusedBeforeAllocating) {
  test::TempDir dir;
  MultiHeadAttention(LayerConfig{.embed_dim = 4, .num_heads = 2, .seed = 3}).save(dir.file("good.safetensors"));
  std::map<std::string, std::string> meta;
  const TensorMap tensors = load_safetensors(dir.file("good.safetensors"), &meta);
  std::vector<std::pair<std::string, TensorView<const float>>> list;
  for (const auto& [name, t] : tensors) list.emplace_back(name, t.view());
  for (const auto& [dims, needle] :
       {std::pair{std::pair{"4096", "4096"}, "needs at least 134217728 weights, far more than the 64 values"},
        std::pair{std::pair{"9000000000000000000", "9000000000000000000"}, "far more than the 64 values"},
        std::pair{std::pair{"4", "70000"}, "needs at least 2240000 weights"}}) {
    SCOPED_TRACE(dims.first + std::string(" ") + dims.second);
    std::map<std::string, std::string> bad = meta;
    bad["qkv.embed_dim"] = dims.first;
    bad["qkv.head_dim"] = dims.second;
    bad["qkv.value_dim"] = dims.second;
    save_safetensors(dir.file("bad.safetensors"), list, bad);
    test::expect_error([&] { MultiHeadAttention::load(dir.file("bad.safetensors")); },
                       {dir.file("bad.safetensors"), needle});
  }
}

}  // namespace
}  // namespace qkv
