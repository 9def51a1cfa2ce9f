#include "qkv/dropout.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "qkv/error.h"
#include "qkv/options_parse.h"

namespace qkv {

void check_dropout(const Dropout& d, const char* what) {
  try {
    dropout_p_value(d.p);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", what, e.what()));
  }
}

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  // The round multipliers and Weyl key increments of Philox4x32 (Random123's constants).
  constexpr uint64_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;
  constexpr uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = kM0 * c[0], p1 = kM1 * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kW0, k[1] += kW1;
  }
  return c;
}

DropoutRow::DropoutRow(const Dropout& d, int64_t H, int64_t b, int64_t h, int64_t i)
    : first_key_(d.first_key),
      key_{static_cast<uint32_t>(d.seed), static_cast<uint32_t>(d.seed >> 32) ^ static_cast<uint32_t>(d.offset >> 32)},
      row_(static_cast<uint32_t>(d.first_row + i)),
      head_(static_cast<uint32_t>((d.first_batch + b) * H + h)),
      offset_(static_cast<uint32_t>(d.offset)),
      // keep iff a uniform 32-bit word >= p·2^32: P(keep) = 1 − p to within 2^-32.
      threshold_(static_cast<uint32_t>(std::min(std::ldexp(d.p, 32), 4294967295.0))) {}

}  // namespace qkv
