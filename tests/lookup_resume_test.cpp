// Resuming the lookup task's training from a checkpoint whose checksum is valid but whose
// contents training never writes: refused with the entry at fault, before anything is loaded.
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include "io_test_util.h"
#include "qkv/checkpoint.h"
#include "qkv/lookup.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::expect_error;

TEST(LookupResume, RefusesCheckpointsTrainingNeverWrites) {
  test::TempDir dir;
  LookupConfig c;
  c.pairs = 2;
  c.num_keys = c.num_values = 8;
  c.embed_dim = 8;
  c.heads = 2;
  c.batch = 4;
  c.steps = 4;
  c.eval_examples = 8;
  c.checkpoint = dir.file("run.safetensors");
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
  // train.step must be all of a whole number in [0, steps].
  for (const std::string step : {"2junk", "", " 2", "+2", "0x2", "-1", "5", "99999999999999999999"}) {
    SCOPED_TRACE("train.step '" + step + "'");
    Checkpoint ck = load_checkpoint(good);
    ck.metadata.at("train.step") = step;
    write(ck);
    expect_error([&] { train_lookup(c, {}); },
                 {"checkpoint " + c.checkpoint + " has no valid train.step / train.rng entries"});
  }
  Checkpoint ck = load_checkpoint(good);
  ck.metadata.at("train.step") = "2";
  write(ck);
  EXPECT_EQ(train_lookup(c, {}).resumed_from, 2);
}

}  // namespace
}  // namespace qkv
