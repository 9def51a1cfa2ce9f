// The mask and dropout dictionary every attention entry point of the Python module accepts.
// Everything here runs with the GIL held.
#pragma once

#include <cstdint>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "qkv/dropout.h"
#include "qkv/mask.h"

namespace qkvpy {

namespace py = pybind11;

// Holds everything a qkv::Mask borrows (converted bias or keep arrays) for the duration of a call.
struct MaskArgs {
  qkv::Mask mask;
  py::array keep_owner;
  py::array bias_owner;
};

// Builds a mask from the dictionary the Python layer passes (keys: causal, causal_align,
// key_lengths, query_lengths, window, keep_mask, bias, alibi_slopes, softcap; missing keys or None
// mean "off"). keep_mask and bias broadcast to [B, H, N, M] by numpy rules. Raises TypeError or
// ValueError naming the key.
MaskArgs parse_mask(const py::dict& kwargs, int64_t B, int64_t H, int64_t N, int64_t M);

// Attention dropout from the same dictionary (keys dropout_p, dropout_seed, dropout_offset; missing
// or None: off). ValueError for p outside [0, 1) or p > 0 without a seed; seeds are integers in
// [0, 2**64) (seed_arg, bind_util.h).
qkv::Dropout dropout_arg(const py::dict& mask);

}  // namespace qkvpy
