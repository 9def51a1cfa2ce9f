// `qkv attend --ring`: ring attention across the ranks of `mpirun -np P qkv attend --ring ...`.
// Built only with MPI (QKV_HAVE_MPI); cmd_attend.cpp calls it.
#pragma once

#include <optional>
#include <string>

#include "cli_mask.h"
#include "cli_util.h"

namespace qkv::cli {

struct RingAttendArgs {
  std::string q, k, v, out, lse;
  std::optional<double> scale;
  int threads = 0;
};

// Each rank maps the .npy inputs and reads only its zigzag shard; the outputs are written once,
// in sequence order, into a temporary file beside each output that rank 0 renames into place
// after every rank has written its rows (a single-process run's file, up to rounding). Any
// rank's failure makes every rank throw qkv::Error naming that rank; no output is left behind.
// Initializes MPI if needed and finalizes what it initialized.
int run_attend_ring(const RingAttendArgs& args, MaskArgs& mask);

}  // namespace qkv::cli
