// The largest error a value stored in a KV cache page may have, for tests that check stored and
// decoded values against the values appended.
#pragma once

#include <algorithm>
#include <cmath>

#include "qkv/kv_dtype.h"

namespace qkv::test {

// Half an ulp of bf16/fp16; for int8 half a step (max|x| / 127 of its token and head) plus the
// float rounding of q · scale on the way back (10^4 soak steps met a value 1e-8 past the half step
// alone). amax: the largest |x| of the value's token and head.
inline double storage_error(KVDtype dtype, double x, double amax) {
  switch (dtype) {
    case KVDtype::f32:
      return 0.0;
    case KVDtype::bf16:
      return std::fabs(x) * std::ldexp(1.0, -8);
    case KVDtype::f16:
      return std::max(std::fabs(x) * std::ldexp(1.0, -11), std::ldexp(1.0, -25));
    case KVDtype::i8:
      return amax / 127.0 / 2.0 * (1 + 1e-6) + (std::fabs(x) + amax) * std::ldexp(1.0, -24) + 1e-30;
  }
  return 0.0;
}

}  // namespace qkv::test
