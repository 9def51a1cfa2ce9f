// MultiHeadAttention::save / load: round trip and refusal of bad files.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "qkv/io.h"
#include "qkv/layer.h"
#include "test_util.h"

namespace qkv {
namespace {

void randomize_biases(MultiHeadAttention& layer, test::Rng& rng) {
  for (Tensor<float>* b : {&layer.b_q, &layer.b_k, &layer.b_v, &layer.b_o})
    for (int64_t i = 0; i < b->numel(); ++i) (*b)[i] = static_cast<float>(rng.uniform(-0.5, 0.5));
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("qkv_layer_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST(LayerIo, SaveLoadRoundTrip) {
  test::Rng rng("Layer.SaveLoad");
  LayerConfig c{
      .embed_dim = 12, .num_heads = 4, .num_kv_heads = 2, .head_dim = 5, .value_dim = 7, .bias = true, .seed = 9};
  MultiHeadAttention layer(c);
  randomize_biases(layer, rng);
  const std::string path = temp_path("roundtrip.safetensors");
  layer.save(path);
  MultiHeadAttention loaded = MultiHeadAttention::load(path);
  std::filesystem::remove(path);
  EXPECT_EQ(loaded.config().num_kv_heads, 2);
  EXPECT_EQ(loaded.config().value_dim, 7);
  EXPECT_TRUE(loaded.config().bias);
  auto pa = layer.parameters(), pb = loaded.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t p = 0; p < pa.size(); ++p)
    for (int64_t i = 0; i < pa[p].second->numel(); ++i)
      ASSERT_EQ((*pa[p].second)[i], (*pb[p].second)[i]) << pa[p].first;
  Tensor<float> x = rng.normal32(std::array<int64_t, 3>{2, 3, 12});
  Tensor<float> ya = layer.forward(x.cview()), yb = loaded.forward(x.cview());
  for (int64_t i = 0; i < ya.numel(); ++i) EXPECT_EQ(ya[i], yb[i]);
}

TEST(LayerIo, NpyDirectoryRoundTripAndRefusals) {
  test::Rng rng("Layer.NpyDir");
  MultiHeadAttention layer(LayerConfig{.embed_dim = 6, .num_heads = 3, .num_kv_heads = 1, .bias = true, .seed = 4});
  randomize_biases(layer, rng);
  const std::filesystem::path dir = temp_path("npy_dir");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  layer.save(dir.string());
  for (const char* name : {"w_q.npy", "w_k.npy", "w_v.npy", "w_o.npy", "b_q.npy", "b_o.npy", "qkv_layer.json"})
    EXPECT_TRUE(std::filesystem::exists(dir / name)) << name;
  // The weights are plain .npy: what numpy or another tool would read back.
  Tensor<float> w_k = load_npy<float>((dir / "w_k.npy").string());
  ASSERT_EQ(w_k.rank(), 2);
  EXPECT_EQ(w_k.dim(0), 6);
  EXPECT_EQ(w_k.dim(1), 2);
  for (int64_t i = 0; i < w_k.numel(); ++i) EXPECT_EQ(w_k[i], layer.w_k[i]);
  MultiHeadAttention loaded = MultiHeadAttention::load(dir.string());
  Tensor<float> x = rng.normal32(std::array<int64_t, 2>{5, 6});
  Tensor<float> ya = layer.forward(x.cview()), yb = loaded.forward(x.cview());
  for (int64_t i = 0; i < ya.numel(); ++i) EXPECT_EQ(ya[i], yb[i]);

  Tensor<float> wrong({6, 5});
  save_npy<float>((dir / "w_v.npy").string(), wrong.cview());
  expect_error([&] { MultiHeadAttention::load(dir.string()); },
               "tensor w_v has shape [6, 5] but the config needs [6, 2]");
  std::filesystem::remove(dir / "w_v.npy");
  expect_error([&] { MultiHeadAttention::load(dir.string()); }, "missing tensor w_v");
  save_npy<float>((dir / "w_v.npy").string(), layer.w_v.cview());
  // Names that do not resolve (links to themselves) are named in a qkv::Error.
  std::filesystem::remove(dir / "b_q.npy");
  std::filesystem::create_symlink("b_q.npy", dir / "b_q.npy");
  expect_error([&] { MultiHeadAttention::load(dir.string()); },
               "cannot open " + (dir / "b_q.npy").string() + ": Too many levels of symbolic links");
  std::filesystem::remove(dir / "b_q.npy");
  save_npy<float>((dir / "b_q.npy").string(), layer.b_q.cview());
  const std::filesystem::path loop = dir / "loop";
  std::filesystem::create_symlink("loop", loop);
  expect_error([&] { MultiHeadAttention::load(loop.string()); },
               "cannot open " + loop.string() + ": Too many levels of symbolic links");
  expect_error([&] { layer.save(loop.string()); }, "loop");
  std::filesystem::remove(loop);
  // The config is read by the same strict JSON rule as safetensors headers (it kept the last of
  // two copies of a key, and read "{...}\0garbage" as "{...}").
  auto write_config = [&](const std::string& text) {
    std::ofstream((dir / "qkv_layer.json").string(), std::ios::binary) << text;
  };
  write_config(R"({"qkv.embed_dim": "6", "qkv.embed_dim": "8"})");
  expect_error([&] { MultiHeadAttention::load(dir.string()); },
               "the layer config has the key \"qkv.embed_dim\" twice in one object");
  write_config(std::string("{}\0x", 4));
  expect_error([&] { MultiHeadAttention::load(dir.string()); }, "the layer config holds a NUL byte at offset 2");
  write_config("{\"a\": ");
  expect_error([&] { MultiHeadAttention::load(dir.string()); }, "the layer config is not valid JSON");
  std::filesystem::remove(dir / "w_v.npy");
  std::filesystem::remove(dir / "qkv_layer.json");
  expect_error([&] { MultiHeadAttention::load(dir.string()); }, "cannot open the layer config");
  // A FIFO in its place is refused at once (reading it waited for a writer).
  ASSERT_EQ(::mkfifo((dir / "qkv_layer.json").c_str(), 0600), 0);
  expect_error([&] { MultiHeadAttention::load(dir.string()); }, "not a regular file");
  std::filesystem::remove_all(dir);
}

TEST(LayerIo, ANpyDirectoryHoldsTheLastSavedLayerOrNone) {
  test::Rng rng("Layer.NpyDirReplace");
  MultiHeadAttention with_biases(LayerConfig{.embed_dim = 6, .num_heads = 2, .bias = true, .seed = 1});
  randomize_biases(with_biases, rng);
  const MultiHeadAttention plain(LayerConfig{.embed_dim = 6, .num_heads = 3, .seed = 2});
  const std::filesystem::path dir = temp_path("npy_dir_replace");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream((dir / "README").string()) << "the user's own file";
  auto expect_holds = [&](const MultiHeadAttention& want) {
    const MultiHeadAttention got = MultiHeadAttention::load(dir.string());
    EXPECT_EQ(got.config().num_heads, want.config().num_heads);
    EXPECT_EQ(got.config().seed, want.config().seed);
    for (std::size_t p = 0; p < got.parameters().size(); ++p)
      for (int64_t i = 0; i < want.parameters()[p].second->numel(); ++i)
        ASSERT_EQ((*got.parameters()[p].second)[i], (*want.parameters()[p].second)[i]);
  };
  with_biases.save(dir.string());
  // The biases' files of the layer before were left behind, and load() refused the directory.
  plain.save(dir.string());
  expect_holds(plain);
  EXPECT_FALSE(std::filesystem::exists(dir / "b_q.npy"));
  EXPECT_TRUE(std::filesystem::exists(dir / "README"));
  // A target refused before anything is written leaves every file as it was.
  auto bytes = [&](const char* name) {
    std::ifstream in((dir / name).string(), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string config_before = bytes("qkv_layer.json"), w_q_before = bytes("w_q.npy");
  std::filesystem::create_directory(dir / "b_v.npy");
  expect_error([&] { with_biases.save(dir.string()); }, "b_v.npy");
  EXPECT_EQ(bytes("qkv_layer.json"), config_before);
  EXPECT_EQ(bytes("w_q.npy"), w_q_before);
  std::filesystem::remove(dir / "b_v.npy");
  expect_holds(plain);
  // A write that fails part way (w_o.npy a link to /dev/full: no space left) leaves no config, so
  // the directory is refused, never read as the old config over the new tensors.
  std::filesystem::remove(dir / "w_o.npy");
  std::filesystem::create_symlink("/dev/full", dir / "w_o.npy");
  expect_error([&] { with_biases.save(dir.string()); }, "w_o.npy");
  expect_error([&] { MultiHeadAttention::load(dir.string()); }, "cannot open the layer config");
  std::filesystem::remove(dir / "w_o.npy");
  with_biases.save(dir.string());
  expect_holds(with_biases);
  std::filesystem::remove_all(dir);
}

TEST(LayerIo, LoadRefusesMissingAndMisshapenTensors) {
  MultiHeadAttention layer(LayerConfig{.embed_dim = 4, .num_heads = 2, .seed = 1});
  const std::string good = temp_path("good.safetensors"), bad = temp_path("bad.safetensors");
  layer.save(good);
  std::map<std::string, std::string> meta;
  TensorMap tensors = load_safetensors(good, &meta);
  auto write_without = [&](const std::string& skip, const Tensor<float>* replacement) {
    std::vector<std::pair<std::string, TensorView<const float>>> list;
    for (const auto& [name, t] : tensors)
      if (name != skip)
        list.emplace_back(name, t.view());
      else if (replacement)
        list.emplace_back(name, replacement->view());
    save_safetensors(bad, list, meta);
  };
  write_without("w_k", nullptr);
  expect_error([&] { MultiHeadAttention::load(bad); }, "missing tensor w_k");
  Tensor<float> wrong({4, 3});
  write_without("w_v", &wrong);
  expect_error([&] { MultiHeadAttention::load(bad); }, "tensor w_v has shape [4, 3] but the config needs [4, 4]");
  Tensor<float> nan_w({4, 4});
  nan_w[5] = std::nanf("");
  write_without("w_q", &nan_w);
  expect_error([&] { MultiHeadAttention::load(bad); }, "tensor w_q has a non-finite value");
  // save() refuses what load() would (it once wrote the file, which then could not be read).
  MultiHeadAttention broken(LayerConfig{.embed_dim = 4, .num_heads = 2, .seed = 1});
  (*broken.parameters()[1].second)[2] = std::numeric_limits<float>::infinity();
  const std::string refused = temp_path("refused.safetensors");
  expect_error([&] { broken.save(refused); }, "not saved: weight w_k has a non-finite value (inf) at flat index 2");
  EXPECT_FALSE(std::filesystem::exists(refused));
  Tensor<float> extra({4});
  std::vector<std::pair<std::string, TensorView<const float>>> list;
  for (const auto& [name, t] : tensors) list.emplace_back(name, t.view());
  list.emplace_back("b_q", extra.view());
  save_safetensors(bad, list, meta);
  expect_error([&] { MultiHeadAttention::load(bad); }, "b_q is present but the layer config has no such parameter");
  save_safetensors(bad, list, {});
  expect_error([&] { MultiHeadAttention::load(bad); }, "not a qkv layer file");
  meta["qkv.num_heads"] = "two";
  write_without("", nullptr);
  expect_error([&] { MultiHeadAttention::load(bad); }, "qkv.num_heads = 'two' is not an integer");
  meta["qkv.num_heads"] = "2";
  // The seed once went through strtoull unchecked: "banana" loaded as 0, "-1" as 2^64 - 1.
  const std::pair<const char*, const char*> seeds[] = {
      {"banana", "qkv.seed = 'banana' is not an integer"},
      {"-1", "qkv.seed = '-1' is not an integer"},
      {"7x", "qkv.seed = '7x' is not an integer"},
      {"18446744073709551616", "qkv.seed = '18446744073709551616' is out of range [0, 18446744073709551615]"}};
  for (const auto& [seed, message] : seeds) {
    meta["qkv.seed"] = seed;
    write_without("", nullptr);
    expect_error([&] { MultiHeadAttention::load(bad); }, message);
  }
  meta["qkv.seed"] = "18446744073709551615";
  write_without("", nullptr);
  EXPECT_EQ(MultiHeadAttention::load(bad).config().seed, UINT64_MAX);
  std::filesystem::remove(good);
  std::filesystem::remove(bad);
}

}  // namespace
}  // namespace qkv
