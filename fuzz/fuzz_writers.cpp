// libFuzzer target: the .npy and .safetensors writers, round trip. The input describes arrays (rank,
// dims, an axis order that makes the view strided, raw element bits: every NaN payload, infinity and
// subnormal) and, for safetensors, names and metadata of raw bytes. Invariants: what save_npy writes
// is npy_bytes, and load_npy reads it back bit for bit in the view's shape; save_safetensors either
// writes a file load_safetensors reads back exactly (names, shapes, bits, metadata) or refuses with
// qkv::Error and leaves the file that was there untouched.
#include "fuzz_util.h"
#include "writers_round_trip.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static qkv::fuzz::ScratchFile npy("writers_npy"), st("writers_st");
  try {
    qkv::fuzz::writers::run(data, size, npy.path(), st.path());
  } catch (const qkv::fuzz::writers::Broken& b) {
    qkv::fuzz::invariant_failed(b.what);
  }
  return 0;
}
