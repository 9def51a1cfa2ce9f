// The body shared by the embedding-file fuzz targets (GloVe, word2vec text, word2vec binary):
// one format per target, so each fuzzer's corpus and coverage stay focused on one parser.
#pragma once

#include <cmath>
#include <string>

#include "fuzz_util.h"
#include "qkv/embeddings.h"
#include "qkv/error.h"

namespace qkv::fuzz {

// Loads `data` as `format` (and, every time, as automatic too). Any input must either load or
// throw qkv::Error; a loaded vocabulary must be non-empty, finite, and find each of its words.
inline int fuzz_embeddings(const uint8_t* data, size_t size, EmbeddingFormat format, const char* tag) {
  static ScratchFile input(tag);
  const std::string& path = input.write(data, size);
  for (EmbeddingFormat f : {format, EmbeddingFormat::automatic}) {
    try {
      const Embeddings e = Embeddings::load(path, f);
      if (e.size() < 1 || e.dim() < 1) invariant_failed("a loaded vocabulary is empty or has width 0");
      for (int64_t i = 0; i < e.size(); ++i) {
        for (float x : e.vector(i))
          if (!std::isfinite(x)) invariant_failed("a loaded vector holds NaN or Inf");
        const int64_t j = e.find(e.word(i));
        if (j < 0 || j > i || e.word(j) != e.word(i)) invariant_failed("find() does not return a word's first index");
      }
    } catch (const Error&) {
    }
  }
  return 0;
}

}  // namespace qkv::fuzz
