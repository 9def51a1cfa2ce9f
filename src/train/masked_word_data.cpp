#include "train/masked_word_data.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>
#include <unordered_set>

#include <fmt/format.h>

#include "core/blas.h"
#include "io/mapped_file.h"
#include "train/lookup_task.h"  // uniform_index
#include "qkv/error.h"

namespace qkv::detail {
namespace {

constexpr int64_t kEvalBatch = 250;

// One line in 20 is held out, chosen by a hash of the line number (so the split does not depend
// on the seed and neighbouring dictionary lines are not all on one side).
bool held_out_line(uint64_t line) {
  uint64_t z = line + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return (z ^ (z >> 31)) % 20 == 0;
}

// Writes the sentences' vectors into x[b] and the mean of the context rows into the hidden row.
void fill_example(const Sentence& s, int64_t hidden, const Embeddings& embeddings, float* x) {
  const int64_t L = static_cast<int64_t>(s.size()), E = embeddings.dim();
  std::vector<double> mean(static_cast<std::size_t>(E), 0.0);
  for (int64_t t = 0; t < L; ++t) {
    const std::span<const float> v = embeddings.vector(s[static_cast<std::size_t>(t)]);
    if (t == hidden) continue;
    std::copy(v.begin(), v.end(), x + t * E);
    for (int64_t e = 0; e < E; ++e) mean[static_cast<std::size_t>(e)] += v[static_cast<std::size_t>(e)];
  }
  for (int64_t e = 0; e < E; ++e)
    x[hidden * E + e] = static_cast<float>(mean[static_cast<std::size_t>(e)] / static_cast<double>(L - 1));
}

MaskedBatch make_batch(const std::vector<const Sentence*>& sentences, const std::vector<int64_t>& hidden,
                       const Embeddings& embeddings) {
  const auto B = static_cast<int64_t>(sentences.size());
  const auto L = static_cast<int64_t>(sentences.front()->size());
  const int64_t E = embeddings.dim();
  MaskedBatch out{Tensor<float>({B, L, E}, "masked-word batch"),
                  hidden,
                  std::vector<int64_t>(sentences.size()),
                  {},
                  MaskedObjective::hidden_slot};
  for (int64_t b = 0; b < B; ++b) {
    const Sentence& s = *sentences[static_cast<std::size_t>(b)];
    fill_example(s, hidden[static_cast<std::size_t>(b)], embeddings, out.x.data() + b * L * E);
    out.targets[static_cast<std::size_t>(b)] = s[static_cast<std::size_t>(hidden[static_cast<std::size_t>(b)])];
  }
  return out;
}

// halves: each sentence split by a uniformly drawn permutation; the layer reads the first L / 2
// positions of it (in sentence order), the rest give the sentence's target, the unit mean of
// their static vectors.
MaskedBatch halves_batch(const std::vector<const Sentence*>& sentences, const Embeddings& embeddings,
                         std::mt19937_64& rng) {
  const auto B = static_cast<int64_t>(sentences.size());
  const auto L = static_cast<int64_t>(sentences.front()->size());
  const int64_t E = embeddings.dim(), A = L / 2;
  MaskedBatch out;
  out.objective = MaskedObjective::halves;
  out.x = Tensor<float>({B, A, E}, "half-sentence batch");
  out.halves = Tensor<float>({B, E}, "other halves");
  std::vector<int64_t> order(static_cast<std::size_t>(L));
  for (int64_t b = 0; b < B; ++b) {
    const Sentence& s = *sentences[static_cast<std::size_t>(b)];
    for (int64_t t = 0; t < L; ++t) order[static_cast<std::size_t>(t)] = t;
    for (int64_t t = L - 1; t > 0; --t)  // Fisher-Yates from the seeded stream (std::shuffle is unspecified)
      std::swap(order[static_cast<std::size_t>(t)], order[static_cast<std::size_t>(uniform_index(rng, t + 1))]);
    std::sort(order.begin(), order.begin() + A);
    for (int64_t r = 0; r < A; ++r) {
      const std::span<const float> v =
          embeddings.vector(s[static_cast<std::size_t>(order[static_cast<std::size_t>(r)])]);
      std::copy(v.begin(), v.end(), out.x.data() + (b * A + r) * E);
    }
    std::vector<double> mean(static_cast<std::size_t>(E), 0.0);
    for (int64_t t = A; t < L; ++t) {
      const std::span<const float> v =
          embeddings.vector(s[static_cast<std::size_t>(order[static_cast<std::size_t>(t)])]);
      for (int64_t e = 0; e < E; ++e) mean[static_cast<std::size_t>(e)] += v[static_cast<std::size_t>(e)];
    }
    double norm = 0.0;
    for (const double m : mean) norm += m * m;
    norm = std::sqrt(norm);
    for (int64_t e = 0; e < E; ++e)
      out.halves[b * E + e] = static_cast<float>(norm > 0 ? mean[static_cast<std::size_t>(e)] / norm : 0.0);
  }
  return out;
}

MaskedBatch make_any_batch(const MaskedCorpus& corpus, const std::vector<const Sentence*>& sentences,
                           const std::vector<int64_t>& hidden, const Embeddings& embeddings, std::mt19937_64& rng) {
  return corpus.objective == MaskedObjective::halves ? halves_batch(sentences, embeddings, rng)
                                                     : make_batch(sentences, hidden, embeddings);
}

// A sentence's words joined by single spaces: how an excluded line and a corpus line are compared.
std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

// The tokenized lines of `path` (config.exclude), words joined by one space.
std::unordered_set<std::string> excluded_lines(const std::string& path) {
  std::unordered_set<std::string> out;
  if (path.empty()) return out;
  std::optional<MappedFile> file;
  try {
    file.emplace(path);
  } catch (const Error& e) {
    throw Error(fmt::format("--exclude FILE (sentences never trained on, one per line): {}", e.what()));
  }
  std::string_view rest = file->bytes();
  while (!rest.empty()) {
    const std::size_t end = std::min(rest.find('\n'), rest.size());
    std::string line = joined(tokenize(rest.substr(0, end)));
    if (!line.empty()) out.insert(std::move(line));
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return out;
}

}  // namespace

MaskedCorpus load_masked_corpus(const MaskedWordConfig& c, const Embeddings& embeddings) {
  // Mapped, so a device or FIFO is refused by the file rule instead of read (or waited on) forever.
  std::optional<MappedFile> file;
  try {
    file.emplace(c.sentences);
  } catch (const Error& e) {
    throw Error(fmt::format("masked-word: --sentences FILE (one sentence per line): {}", e.what()));
  }
  MaskedCorpus corpus;
  corpus.min_length = c.min_length;
  corpus.objective = c.objective;
  const std::unordered_set<std::string> excluded = excluded_lines(c.exclude);
  corpus.train.resize(static_cast<std::size_t>(c.max_length - c.min_length + 1));
  std::string_view rest = file->bytes();
  for (uint64_t n = 0; !rest.empty() && (c.max_sentences <= 0 || n < uint64_t(c.max_sentences)); ++n) {
    const std::size_t end = std::min(rest.find('\n'), rest.size());
    const std::string_view line = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    const std::vector<std::string> words = tokenize(line);
    const auto L = static_cast<int64_t>(words.size());
    if (L < c.min_length || L > c.max_length) continue;
    Sentence s;
    for (const std::string& w : words) {
      const int64_t id = embeddings.find(w);
      if (id < 0) break;
      s.push_back(static_cast<int32_t>(id));
    }
    if (static_cast<int64_t>(s.size()) != L) continue;  // a word without a vector
    if (!excluded.empty() && excluded.count(joined(words)) > 0) {
      ++corpus.excluded;
      continue;
    }
    if (held_out_line(n)) {
      corpus.held_out.push_back(std::move(s));
    } else {
      corpus.train[static_cast<std::size_t>(L - c.min_length)].push_back(std::move(s));
      ++corpus.train_count;
    }
  }
  // Usable: the length asked for, every word with a vector. Say why none is left for a part.
  const std::string usable = fmt::format("{} to {} words, every word in the embeddings", c.min_length, c.max_length);
  const std::string excluded_note =
      corpus.excluded > 0 ? fmt::format("; --exclude left out {} usable ones", corpus.excluded) : "";
  if (corpus.train_count == 0)
    throw Error(fmt::format("--sentences {}: no usable training sentence ({}){}", c.sentences, usable, excluded_note));
  if (corpus.held_out.empty())
    throw Error(fmt::format(
        "--sentences {}: no usable held-out sentence ({}): about one line in 20 is held out, chosen by its line "
        "number, and none of the {} usable lines was{}; give more sentences",
        c.sentences, usable, corpus.train_count, excluded_note));
  return corpus;
}

MaskedBatch sample_batch(const MaskedCorpus& corpus, const Embeddings& embeddings, int64_t batch,
                         std::mt19937_64& rng) {
  // The bucket of a uniformly drawn sentence: buckets are drawn in proportion to their size.
  int64_t pick = uniform_index(rng, corpus.train_count);
  std::size_t bucket = 0;
  while (pick >= static_cast<int64_t>(corpus.train[bucket].size()))
    pick -= static_cast<int64_t>(corpus.train[bucket++].size());
  const std::vector<Sentence>& pool = corpus.train[bucket];
  std::vector<const Sentence*> sentences;
  std::vector<int64_t> hidden;
  for (int64_t b = 0; b < batch; ++b) {
    sentences.push_back(
        &pool[static_cast<std::size_t>(b == 0 ? pick : uniform_index(rng, static_cast<int64_t>(pool.size())))]);
    hidden.push_back(uniform_index(rng, static_cast<int64_t>(sentences.back()->size())));
  }
  return make_any_batch(corpus, sentences, hidden, embeddings, rng);
}

std::vector<MaskedBatch> held_out_batches(const MaskedCorpus& corpus, const Embeddings& embeddings, int64_t examples,
                                          std::mt19937_64& rng) {
  const int64_t n = std::min<int64_t>(examples, static_cast<int64_t>(corpus.held_out.size()));
  std::vector<std::vector<const Sentence*>> by_length(corpus.train.size());
  std::vector<std::vector<int64_t>> hidden(corpus.train.size());
  for (int64_t i = 0; i < n; ++i) {
    const Sentence& s = corpus.held_out[static_cast<std::size_t>(i)];
    const std::size_t bucket = s.size() - static_cast<std::size_t>(corpus.min_length);
    by_length[bucket].push_back(&s);
    hidden[bucket].push_back(uniform_index(rng, static_cast<int64_t>(s.size())));
  }
  std::vector<MaskedBatch> out;
  for (std::size_t k = 0; k < by_length.size(); ++k)
    for (std::size_t start = 0; start < by_length[k].size(); start += kEvalBatch) {
      const std::size_t end = std::min(by_length[k].size(), start + kEvalBatch);
      out.push_back(make_any_batch(corpus, {by_length[k].begin() + start, by_length[k].begin() + end},
                                   {hidden[k].begin() + start, hidden[k].begin() + end}, embeddings, rng));
    }
  return out;
}

MaskedReadout masked_readout(const Tensor<float>& y, const MaskedBatch& batch, const Embeddings& embeddings,
                             Tensor<float>* dy, int threads) {
  const int64_t B = y.dim(0), L = y.dim(1), E = y.dim(2);
  const bool halves = batch.objective == MaskedObjective::halves;
  const int64_t R = halves ? B * L : B;  // scored rows
  const int64_t V = halves ? B : embeddings.size();
  const float* table = halves ? batch.halves.data() : embeddings.matrix().data();
  auto row_of = [&](int64_t r) { return halves ? r : r * L + batch.hidden[static_cast<std::size_t>(r)]; };
  auto target_of = [&](int64_t r) { return halves ? r / L : batch.targets[static_cast<std::size_t>(r)]; };
  // The scored rows, gathered: h [R, E]; logits [R, V] = h · tableᵀ.
  Tensor<float> h({R, E}, "scored rows"), logits({R, V}, "logits");
  for (int64_t r = 0; r < R; ++r) std::copy_n(y.data() + row_of(r) * E, E, h.data() + r * E);
  sgemm(false, true, R, V, E, 1.0f, h.data(), E, table, E, 0.0f, logits.data(), V, threads);
  MaskedReadout out;
  out.rows = R;
  for (int64_t r = 0; r < R; ++r) {
    float* row = logits.data() + r * V;
    const int64_t target = target_of(r);
    const float score = row[target];
    // Rank of the target: candidates scoring higher, and those scoring the same that come before it
    // (the first maximum wins, as in the lookup task): with ties counted for the target, vectors all
    // alike scored 100%.
    int64_t above = 0;
    for (int64_t v = 0; v < V; ++v) above += row[v] > score || (row[v] == score && v < target);
    out.top1 += above == 0;
    out.top10 += above < 10;
    const float best = *std::max_element(row, row + V);
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - best);
    const double lse = best + std::log(sum);
    out.loss += lse - score;
    for (int64_t v = 0; v < V; ++v)  // dL/dlogits = (softmax - onehot) / R, in place
      row[v] = static_cast<float>((std::exp(double(row[v]) - lse) - (v == target ? 1.0 : 0.0)) / double(R));
  }
  out.loss /= static_cast<double>(R);
  if (dy) {
    *dy = Tensor<float>(y.shape(), "dy");
    sgemm(false, false, R, E, V, 1.0f, logits.data(), V, table, E, 0.0f, h.data(), E, threads);  // dh = dlogits · table
    for (int64_t r = 0; r < R; ++r) std::copy_n(h.data() + r * E, E, dy->data() + row_of(r) * E);
  }
  return out;
}

}  // namespace qkv::detail
