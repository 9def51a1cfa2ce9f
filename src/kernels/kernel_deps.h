// What the kernels' shared templates (microkernel.h, forward_tile.h, backward_tile.h,
// decode_tile.h and the headers they include) take from the standard library, the intrinsics and
// the layers below; every family's ops.h includes it first.
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

#include "kernels/dispatch.h"
#include "kernels/exp2_constants.h"
#include "kernels/forward.h"
#include "kernels/mask_eval.h"
