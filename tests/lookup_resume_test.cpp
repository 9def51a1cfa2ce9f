// Resuming the lookup task's training from a checkpoint whose checksum is valid but whose
// contents training never writes: refused with the entry at fault, before anything is loaded.
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "io_test_util.h"
#include "qkv/checkpoint.h"
#include "qkv/lookup.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::expect_error;

// A run of `steps` steps that trains in milliseconds, checkpointing into `dir`.
LookupConfig small_run(const test::TempDir& dir, int64_t steps) {
  LookupConfig c;
  c.pairs = 2;
  c.num_keys = c.num_values = 8;
  c.embed_dim = 8;
  c.heads = 2;
  c.batch = 4;
  c.steps = steps;
  c.eval_examples = 8;
  c.checkpoint = dir.file("run.safetensors");
  return c;
}

TEST(LookupResume, RefusesCheckpointsTrainingNeverWrites) {
  test::TempDir dir;
  LookupConfig c = small_run(dir, 4);
  train_lookup(c, {});
  const std::string good = dir.file("good.safetensors");
  std::filesystem::copy_file(c.checkpoint, good);
  // Writes `ck` over the run's checkpoint with a valid checksum.
  auto write = [&](const Checkpoint& ck) {
    std::vector<std::pair<std::string, TensorView<const float>>> views;
    for (const auto& [name, t] : ck.tensors) views.emplace_back(name, t.cview());
    save_checkpoint(c.checkpoint, views, ck.metadata);
  };
  c.resume = true;

  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    Checkpoint ck = load_checkpoint(good);
    ck.tensors.at("w_k")[8 + 3] = bad;  // w_k[1, 3] of [8, 8]
    write(ck);
    expect_error([&] { train_lookup(c, {}); }, {"checkpoint " + c.checkpoint + ": weight w_k[1, 3] = " +
                                                (std::isnan(bad) ? "nan" : "-inf") + " must be finite"});
  }
  // A metadata entry set to each bad value in turn is refused with `message`.
  auto refused = [&](const std::string& key, std::initializer_list<std::string> values, const std::string& message) {
    for (const std::string& value : values) {
      SCOPED_TRACE(key + " '" + value + "'");
      Checkpoint ck = load_checkpoint(good);
      ck.metadata.at(key) = value;
      write(ck);
      expect_error([&] { train_lookup(c, {}); }, {"checkpoint " + c.checkpoint + message});
    }
  };
  // train.step must be all of a whole number in [0, steps].
  refused("train.step", {"2junk", "", " 2", "+2", "0x2", "-1", "5", "99999999999999999999"},
          " has no valid train.step / train.rng entries");
  // The window of the last steps' losses: pairs of finite numbers, at most the window's length.
  refused("train.recent", {"1.5", "1.5:", "1.5:0.2,", "nan:0.2", "1.5:0.2;2:0.1", "1.5:0.2 "},
          ": train.recent is not a list of at most 50 loss:accuracy pairs");
  Checkpoint ck = load_checkpoint(good);
  ck.metadata.at("train.step") = "2";
  write(ck);
  EXPECT_EQ(train_lookup(c, {}).resumed_from, 2);
}

TEST(LookupResume, ReportsTheLossOfTheUninterruptedRun) {
  // The final loss is the mean over the last steps' window, which a resumed run started empty: it
  // reported the mean over the steps it ran itself, and 0 when the checkpoint had finished.
  test::TempDir dir;
  LookupConfig c = small_run(dir, 12);
  c.checkpoint_every = 5;
  std::vector<TrainProgress> whole, resumed;
  const double uninterrupted = train_lookup(c, [&](const TrainProgress& p) { whole.push_back(p); }).final_loss;
  std::filesystem::copy_file(c.checkpoint + ".prev", dir.file("at10.safetensors"));  // step 10's
  const std::string finished = dir.file("at12.safetensors");
  std::filesystem::copy_file(c.checkpoint, finished);
  c.resume = true;
  c.checkpoint = dir.file("at10.safetensors");
  EXPECT_EQ(train_lookup(c, [&](const TrainProgress& p) { resumed.push_back(p); }).final_loss, uninterrupted);
  ASSERT_EQ(resumed.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(resumed[i].step, whole[10 + i].step);
    EXPECT_EQ(resumed[i].loss, whole[10 + i].loss);
    EXPECT_EQ(resumed[i].accuracy, whole[10 + i].accuracy);
  }
  c.checkpoint = finished;
  EXPECT_EQ(train_lookup(c, {}).final_loss, uninterrupted);
}

}  // namespace
}  // namespace qkv
