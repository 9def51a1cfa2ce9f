// The AVX-512 decode reduction under the name bench/decode_floor_probe.cpp includes; it lives in
// avx512/reduce_lanes.h.
#pragma once

#include "kernels/avx512/reduce_lanes.h"
