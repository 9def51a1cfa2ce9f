// libFuzzer target: qkv::tokenize, the sentence tokenizer; the invariants are in tokenize_check.h.
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "tokenize_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (const char* broken = qkv::fuzz::tokenize_broken(std::string_view(reinterpret_cast<const char*>(data), size)))
    qkv::fuzz::invariant_failed(broken);
  return 0;
}
