// Everything the SIMD-family headers (simd_*.h, microkernel.h, tile_forward.h) need, included by
// each family's .cpp BEFORE its `#pragma GCC target`. Code defined after the pragma is compiled
// for that family's ISA; library code (std, MaskEval) must be compiled before it, for the
// baseline ISA, or the linker could pick an AVX-512 copy of an inline function for every caller.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>

#include "kernels/exp2_constants.h"
#include "kernels/fused_forward.h"
#include "kernels/mask_eval.h"
