// libFuzzer target: Embeddings::load with EmbeddingFormat::glove (and automatic detection).
#include "fuzz_embeddings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return qkv::fuzz::fuzz_embeddings(data, size, qkv::EmbeddingFormat::glove, "glove");
}
