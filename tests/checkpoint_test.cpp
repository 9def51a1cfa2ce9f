// Checkpoints: round trip, refusal of corrupted and truncated files, and the kept previous file.
#include "qkv/checkpoint.h"
#include "qkv/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("qkv_checkpoint_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

void expect_error(const std::function<void()>& f, const std::string& needle) { test::expect_error(f, {needle}); }

bool same(const Tensor<float>& a, TensorView<const float> b) {
  Tensor<float> bc = to_contiguous<float>(b);
  return a.numel() == bc.numel() && std::memcmp(a.data(), bc.data(), a.numel() * sizeof(float)) == 0;
}

TEST_F(CheckpointTest, RoundTripIsExactAndKeepsPrevious) {
  test::Rng rng("Checkpoint.RoundTrip");
  Tensor<float> w = rng.normal32(std::vector<int64_t>{3, 5}), m = rng.normal32(std::vector<int64_t>{7});
  const std::string f = path("ckpt.safetensors");
  // A transposed view: stored as its logical (row-major) values.
  save_checkpoint(f, {{"w", w.cview().transposed(0, 1)}, {"opt.m", m.cview()}}, {{"step", "10"}, {"rng", "1 2 3"}});
  EXPECT_FALSE(fs::exists(f + ".prev"));
  Checkpoint c = load_checkpoint(f);
  EXPECT_EQ(c.metadata.at("step"), "10");
  EXPECT_EQ(c.metadata.at("rng"), "1 2 3");
  EXPECT_EQ(c.metadata.count(kChecksumKey), 0u);
  EXPECT_TRUE(same(c.tensors.at("w"), w.cview().transposed(0, 1)));
  EXPECT_TRUE(same(c.tensors.at("opt.m"), m.cview()));

  m[0] += 1.0f;
  save_checkpoint(f, {{"opt.m", m.cview()}}, {{"step", "20"}});
  EXPECT_EQ(load_checkpoint(f).metadata.at("step"), "20");
  EXPECT_EQ(load_checkpoint(f + ".prev").metadata.at("step"), "10");
}

TEST_F(CheckpointTest, CorruptedOrTruncatedFilesAreRefusedAndPreviousSurvives) {
  test::Rng rng("Checkpoint.Corrupted");
  Tensor<float> w = rng.normal32(std::vector<int64_t>{64});
  const std::string f = path("ckpt.safetensors");
  save_checkpoint(f, {{"w", w.cview()}}, {{"step", "1"}});
  save_checkpoint(f, {{"w", w.cview()}}, {{"step", "2"}});
  const auto size = fs::file_size(f);
  {  // flip one bit in the last float of the data
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(size - 2));
    char byte = 0;
    io.read(&byte, 1);
    byte ^= 0x10;
    io.seekp(static_cast<std::streamoff>(size - 2));
    io.write(&byte, 1);
  }
  expect_error([&] { load_checkpoint(f); }, "is corrupted: checksum");
  expect_error([&] { load_checkpoint(f); }, "the previous checkpoint " + f + ".prev is still there");
  fs::resize_file(f, size - 100);
  expect_error([&] { load_checkpoint(f); }, "checkpoint " + f + " is unreadable");
  EXPECT_EQ(load_checkpoint(f + ".prev").metadata.at("step"), "1");

  // A metadata value changed by hand is caught too.
  const std::string g = path("meta.safetensors");
  save_checkpoint(g, {{"w", w.cview()}}, {{"step", "5"}});
  std::map<std::string, std::string> meta;
  TensorMap tensors = load_safetensors(g, &meta);
  meta["step"] = "6";
  save_safetensors(g, {{"w", tensors.at("w").cview()}}, meta);
  expect_error([&] { load_checkpoint(g); }, "is corrupted");
  save_safetensors(g, {{"w", tensors.at("w").cview()}}, {});
  expect_error([&] { load_checkpoint(g); }, "has no qkv.checksum entry");
}

TEST_F(CheckpointTest, FailedWriteLeavesNothingBehind) {
  Tensor<float> w({4});
  const std::string f = path("missing_dir/ckpt.safetensors");
  expect_error([&] { save_checkpoint(f, {{"w", w.cview()}}, {}); }, "missing_dir");
  EXPECT_FALSE(fs::exists(f));
  expect_error([&] { save_checkpoint(path("dup"), {{"w", w.cview()}, {"w", w.cview()}}, {}); }, "\"w\" is given twice");
  expect_error([&] { load_checkpoint(path("nope")); }, "checkpoint " + path("nope") + " is unreadable");
  // A save refused for its contents keeps the previous checkpoint too: it was replaced by the
  // current one first. A view without data was read for the checksum (SIGSEGV) before the check.
  const std::string g = path("kept.safetensors");
  save_checkpoint(g, {{"w", w.cview()}}, {{"step", "1"}});
  save_checkpoint(g, {{"w", w.cview()}}, {{"step", "2"}});
  expect_error([&] { save_checkpoint(g, {{"w", w.cview()}}, {{"step", "\xff"}}); }, "not valid UTF-8");
  const std::array<int64_t, 1> four{4};
  expect_error([&] { save_checkpoint(g, {{"w", TensorView<const float>(nullptr, four)}}, {}); }, "has no data");
  EXPECT_EQ(load_checkpoint(g).metadata.at("step"), "2");
  EXPECT_EQ(load_checkpoint(g + ".prev").metadata.at("step"), "1");
}

// A run killed after keeping the previous checkpoint but before writing the new one leaves
// path.prev as a second link to path; the next save kept a temporary link beside them for good
// (rename onto another link of the same file does nothing).
TEST_F(CheckpointTest, PreviousThatIsALinkToTheCheckpointLeavesNoTemporary) {
  Tensor<float> w({2}, "w");
  const std::string f = path("ckpt.safetensors");
  save_checkpoint(f, {{"w", w.cview()}}, {{"step", "1"}});
  ASSERT_EQ(::link(f.c_str(), (f + ".prev").c_str()), 0);
  save_checkpoint(f, {{"w", w.cview()}}, {{"step", "2"}});
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt.safetensors", "ckpt.safetensors.prev"}));
  EXPECT_EQ(load_checkpoint(f).metadata.at("step"), "2");
  EXPECT_EQ(load_checkpoint(f + ".prev").metadata.at("step"), "1");
}

// A directory (or a FIFO) at path.prev cannot take the previous checkpoint: check_checkpoint_path
// finds it before a training loop starts, and save_checkpoint refuses it with the same line,
// leaving both as they were. A symbolic link there is taken: the rename replaces the link itself.
TEST_F(CheckpointTest, PreviousThatCannotBeReplacedIsFoundBeforeAnyWrite) {
  Tensor<float> w({2}, "w");
  const std::string f = path("ckpt.safetensors");
  check_checkpoint_path(f);
  save_checkpoint(f, {{"w", w.cview()}}, {{"step", "1"}});
  fs::create_directory(f + ".prev");
  const std::string message = "checkpoint " + f + ": the previous one cannot be kept as " + f +
                              ".prev: it is a directory (remove or rename it)";
  expect_error([&] { check_checkpoint_path(f); }, message);
  expect_error([&] { save_checkpoint(f, {{"w", w.cview()}}, {{"step", "2"}}); }, message);
  EXPECT_EQ(load_checkpoint(f).metadata.at("step"), "1");
  EXPECT_TRUE(fs::is_directory(f + ".prev"));
  fs::remove(f + ".prev");
  ASSERT_EQ(::mkfifo((f + ".prev").c_str(), 0600), 0);
  expect_error([&] { check_checkpoint_path(f); }, ".prev: it is not a regular file");
  fs::remove(f + ".prev");
  fs::create_symlink("elsewhere", f + ".prev");
  check_checkpoint_path(f);
  expect_error([&] { check_checkpoint_path(path("missing_dir/ckpt")); }, "missing_dir");
}

}  // namespace
}  // namespace qkv
