// The masked-word readout (src/train/masked_word_data.h): loss, ranks and dL/dy against a float64
// computation written here, and dL/dy against central differences of that loss.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/embeddings.h"
#include "qkv/masked_word.h"
#include "test_util.h"
#include "train/masked_word_data.h"

namespace qkv {
namespace {

// Mean over the batch of logsumexp(y_h · table) - y_h · table[target], y_h the hidden row.
double reference_loss(const Tensor<float>& y, const detail::MaskedBatch& batch, const Tensor<float>& table,
                      std::vector<int>* rank = nullptr) {
  const int64_t B = y.dim(0), E = y.dim(2), V = table.dim(0);
  double loss = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> logits(static_cast<std::size_t>(V));
    for (int64_t v = 0; v < V; ++v)
      for (int64_t e = 0; e < E; ++e)
        logits[v] += double(y.cview()(b, batch.hidden[b], e)) * double(table.cview()(v, e));
    double top = logits[0], sum = 0;
    for (double l : logits) top = std::max(top, l);
    for (double l : logits) sum += std::exp(l - top);
    loss += top + std::log(sum) - logits[batch.targets[b]];
    if (rank) {
      int above = 0;
      const int64_t target = batch.targets[b];
      for (int64_t v = 0; v < V; ++v)
        above += logits[v] > logits[target] || (logits[v] == logits[target] && v < target);
      rank->push_back(above);
    }
  }
  return loss / static_cast<double>(B);
}

TEST(MaskedWord, ReadoutLossRanksAndGradient) {
  test::Rng rng("MaskedWord.ReadoutLossRanksAndGradient");
  const int64_t B = 3, L = 4, E = 5, V = 23;
  Tensor<float> table = rng.normal32({V, E});
  std::vector<std::string> words;
  for (int64_t v = 0; v < V; ++v) words.push_back(std::to_string(v) + "w");  // (GCC 12 warns on "w" + string)
  const Embeddings embeddings(words, table.clone());
  Tensor<float> y = rng.normal32({B, L, E});
  detail::MaskedBatch batch{Tensor<float>({B, L, E}), {}, {}, {}};
  for (int64_t b = 0; b < B; ++b) {
    batch.hidden.push_back(rng.uniform_int(0, L - 1));
    batch.targets.push_back(rng.uniform_int(0, V - 1));
  }
  Tensor<float> dy;
  const detail::MaskedReadout r = detail::masked_readout(y, batch, embeddings, &dy, 1);
  std::vector<int> rank;
  const double want = reference_loss(y, batch, table, &rank);
  EXPECT_NEAR(r.loss, want, 1e-5 * (1 + std::abs(want))) << "seed " << rng.seed();
  int top1 = 0, top10 = 0;
  for (int above : rank) top1 += above == 0, top10 += above < 10;
  EXPECT_EQ(r.top1, top1);
  EXPECT_EQ(r.top10, top10);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t e = 0; e < E; ++e) {
        if (t != batch.hidden[b]) {
          ASSERT_EQ(dy.cview()(b, t, e), 0.0f);  // only the hidden rows are scored
          continue;
        }
        const float saved = y.view()(b, t, e);
        const double h = 1e-2;
        y.view()(b, t, e) = static_cast<float>(saved + h);
        const double up = reference_loss(y, batch, table);
        y.view()(b, t, e) = static_cast<float>(saved - h);
        const double down = reference_loss(y, batch, table);
        y.view()(b, t, e) = saved;
        ASSERT_NEAR(dy.cview()(b, t, e), (up - down) / (2 * h), 2e-3)
            << "seed " << rng.seed() << " at " << b << "," << e;
      }
}

TEST(MaskedWord, ATieIsNotAHitUnlessTheTargetComesFirst) {
  // Vectors all alike score every candidate the same: each ranks after the candidates before it, as
  // the lookup task's first maximum does (ties counted for the target scored 100%).
  const int64_t B = 4, L = 3, E = 2, V = 12;
  std::vector<std::string> words;
  for (int64_t v = 0; v < V; ++v) words.push_back(std::to_string(v) + "w");
  Tensor<float> table({V, E});
  for (int64_t i = 0; i < table.numel(); ++i) table[i] = 0.5f;
  const Embeddings embeddings(words, table.clone());
  Tensor<float> y({B, L, E});
  for (int64_t i = 0; i < y.numel(); ++i) y[i] = 1.0f;
  detail::MaskedBatch batch{Tensor<float>({B, L, E}), {1, 1, 1, 1}, {0, 5, 9, 11}, {}};
  const detail::MaskedReadout r = detail::masked_readout(y, batch, embeddings, nullptr, 1);
  EXPECT_EQ(r.top1, 1);   // target 0 alone
  EXPECT_EQ(r.top10, 3);  // targets 0, 5 and 9
}

TEST(MaskedWord, TheConfigCheckRefusesWhatTrainingWouldWithoutReadingAFile) {
  // Each was refused only after the files were read (the note, head_dim), or ran out of memory
  // building one list per sentence length (max_length 10^8: std::bad_alloc).
  auto refused = [](auto change, const std::string& why) {
    MaskedWordConfig c;
    change(c);
    test::expect_error([&] { check_masked_word_config(c); }, {"masked-word task: " + why});
  };
  refused([](MaskedWordConfig& c) { c.max_length = 100000000; },
          "sentence lengths must satisfy 2 <= min (4) <= max (100000000) <= 4096");
  refused([](MaskedWordConfig& c) { c.head_dim = int64_t{1} << 62; },
          "heads · head_dim = 2 · 4611686018427387904 is too large (at most 2^40)");
  refused([](MaskedWordConfig& c) { c.note = "on \xff"; }, "the note is not valid UTF-8");
  MaskedWordConfig longest;
  longest.max_length = kMaxSentenceWords;
  check_masked_word_config(longest);
}

}  // namespace
}  // namespace qkv
