// qkv_soak: long-running use with memory and results checked at the end (docs/soak-and-fuzz.md).
//   qkv_soak [--decode-steps N] [--train-steps N] [--io-rounds N] [--dtype D] [--dir DIR] [--seed S] [--leak B]
// Three loops, each sized by its argument so the short ctest (Soak.short) and `make soak` run the
// same code:
//   decode  per cache dtype (f32, bf16, f16, i8), N steps; each step changes the cache (create,
//           append of 1-48 tokens, fork, free) and decodes 1-4 live sequences, checked against a
//           float64 oracle on the stored values; every 1,000 steps the page accounting and the
//           stored values (vs what was appended, within the dtype's rounding) are checked; at the
//           end every live sequence is decoded against the oracle on the values as appended
//           (int8 within the bound of its quantization step), then all are freed and the pool must
//           be whole again.
//   train   N steps of MultiHeadAttention forward, backward and AdamW on batches of random shape;
//           at the end the forward against the float64 layer and the gradients against finite
//           differences of it, and the validation loss below its starting value.
//   io      N rounds of save and load of a layer (safetensors file and .npy directory in turn):
//           the weights, bit for bit, and no file left but the layer's own.
// Each loop samples resident memory (/proc/self/statm) and heap in use (mallinfo2) after a warm-up
// (a tenth of its steps) and at the end, with the same live state at both, and fails if either
// grew past its slack (soak_util.h).
// Exit 0 when every check held, 1 otherwise; each failure is printed.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "soak_util.h"

namespace qkv::soak {

int failures = 0;
int64_t leak_per_step = 0;

void fail(const std::string& what) {
  ++failures;
  std::fprintf(stderr, "qkv_soak: FAILED: %s\n", what.c_str());
}

int64_t rss_kb() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

int64_t warm_up_steps(int64_t steps) { return std::max<int64_t>(1, steps / 10); }

void Memory::sample(int64_t step) {
  // /proc costs some microseconds a read: every 64th step is enough for the peak.
  if (step != 0 && step % 64 != 0) return;
  const int64_t now = rss_kb();
  if (step == 0) start_kb = now;
  peak_kb = std::max(peak_kb, now);
}

// Both samples after malloc_trim: pages malloc keeps free after the loop's largest live state
// (the short run's warm-up comes before that peak) are not growth.
void Memory::warm() {
  malloc_trim(0);
  warm_kb = rss_kb();
  warm_heap = heap_in_use();
  peak_kb = std::max(peak_kb, warm_kb);
}

void Memory::end(const std::string& loop) {
  malloc_trim(0);
  end_kb = rss_kb();
  end_heap = heap_in_use();
  peak_kb = std::max(peak_kb, end_kb);
  if (end_kb > warm_kb + kRssSlackKb)
    fail(fmt::format("{}: resident memory grew from {} KB after warm-up to {} KB at the end", loop, warm_kb, end_kb));
  if (end_heap > warm_heap + kHeapSlackBytes)
    fail(fmt::format("{}: heap in use grew from {} bytes after warm-up to {} at the end", loop, warm_heap, end_heap));
}

std::string Memory::describe() const {
  return fmt::format(
      "RSS {:.1f} MB at start, {:.1f} MB after warm-up, {:.1f} MB at end (peak {:.1f}); heap in use {:.1f} KB after "
      "warm-up, {:.1f} KB at end",
      start_kb / 1024.0, warm_kb / 1024.0, end_kb / 1024.0, peak_kb / 1024.0, warm_heap / 1024.0, end_heap / 1024.0);
}

}  // namespace qkv::soak

namespace {

int64_t arg_value(int& i, int argc, char** argv) {
  if (i + 1 >= argc) {
    std::fprintf(stderr, "qkv_soak: %s needs a value\n", argv[i]);
    std::exit(2);
  }
  char* end = nullptr;
  const long long v = std::strtoll(argv[++i], &end, 10);
  if (*end != '\0' || v < 0) {
    std::fprintf(stderr, "qkv_soak: %s must be a count >= 0, got '%s'\n", argv[i - 1], argv[i]);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qkv::soak;
  int64_t decode_steps = 100000, train_steps = 10000, io_rounds = 10000;
  uint64_t seed = 1;
  std::string dir, only_dtype;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--decode-steps") {
      decode_steps = arg_value(i, argc, argv);
    } else if (a == "--train-steps") {
      train_steps = arg_value(i, argc, argv);
    } else if (a == "--io-rounds") {
      io_rounds = arg_value(i, argc, argv);
    } else if (a == "--seed") {
      seed = static_cast<uint64_t>(arg_value(i, argc, argv));
    } else if (a == "--leak") {
      leak_per_step = arg_value(i, argc, argv);
    } else if (a == "--dtype" && i + 1 < argc) {
      only_dtype = argv[++i];
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else {
      std::fprintf(
          stderr,
          "usage: qkv_soak [--decode-steps N] [--train-steps N] [--io-rounds N] [--dtype D] [--dir DIR] [--seed S] "
          "[--leak BYTES]\n");
      return 2;
    }
  }
  namespace fs = std::filesystem;
  const bool own_dir = dir.empty();
  // tmpfs by default: each save syncs its file, and on a disk the loop would measure the disk.
  const fs::path base = ::access("/dev/shm", W_OK) == 0 ? fs::path("/dev/shm") : fs::temp_directory_path();
  if (own_dir) dir = (base / fmt::format("qkv_soak_{}", ::getpid())).string();
  fs::create_directories(dir);
  std::printf("qkv_soak: seed %llu, %lld decode steps per dtype, %lld training steps, %lld save/load rounds\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(decode_steps),
              static_cast<long long>(train_steps), static_cast<long long>(io_rounds));
  prime();
  for (const qkv::KVDtype dtype : {qkv::KVDtype::f32, qkv::KVDtype::bf16, qkv::KVDtype::f16, qkv::KVDtype::i8})
    if (decode_steps > 0 && (only_dtype.empty() || only_dtype == qkv::kv_dtype_name(dtype)))
      soak_decode(dtype, decode_steps, seed);
  if (train_steps > 0) soak_train(train_steps, seed);
  if (io_rounds > 0) soak_io(io_rounds, dir, seed);
  if (own_dir) fs::remove_all(dir);
  std::printf("qkv_soak: %s\n", failures == 0 ? "all checks held" : fmt::format("{} checks FAILED", failures).c_str());
  return failures == 0 ? 0 : 1;
}
