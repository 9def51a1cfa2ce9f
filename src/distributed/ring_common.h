// The MPI half of the ring forward and backward: the plan agreed over a communicator and
// non-blocking transfers (the rest is ring_plan.h).
#pragma once

#include <mpi.h>

#include <string>

#include "distributed/ring_plan.h"
#include "qkv/distributed.h"

namespace qkv::ring {

// Validates one rank's arguments (local_checks throws qkv::Error on a bad output shape, etc.),
// agrees with every rank on shapes and options, and returns the plan. Throws the same qkv::Error
// on every rank if any rank is wrong.
Plan make_plan(MPI_Comm comm, TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
               const RingOptions& options, const std::function<void(const AttentionShape&)>& local_checks);

// How long a step polls its K/V transfers after posting them (ranks start a step nearly together,
// so the neighbour's message is usually there within this time).
constexpr double kPollSeconds = 0.002;

// Outstanding non-blocking transfers; messages above 2^30 floats go in several parts.
class Transfers {
 public:
  void send(const float* data, int64_t count, int to, int tag, MPI_Comm comm);
  void recv(float* data, int64_t count, int from, int tag, MPI_Comm comm);
  // Rank r's shard as its two messages, k then v (MPI keeps their order: same peer and tag).
  void send_shard(const Plan& plan, int r, ShardAt shard, int to, int tag, MPI_Comm comm);
  void recv_shard(const Plan& plan, int r, float* k, float* v, int from, int tag, MPI_Comm comm);
  void wait();
  // Drives the transfers for at most `seconds` or until they complete. Open MPI moves a large
  // message only inside MPI calls (the receiver copies it), so without this the copy waits for
  // the end of the step and the sender spins there until its partner gets to it.
  void poll(double seconds);
  ~Transfers();

 private:
  std::vector<MPI_Request> requests_;
};

// Throws qkv::Error naming `what` if an MPI call failed.
void check_mpi(int rc, const char* what);

// A rank's first failure after the agreement (no memory for a buffer, an instruction set this
// host lacks, an output past float32): the rank goes on with its part of every transfer, so no
// neighbour waits for it forever, and skips the rest of its work; settle() then throws it as an
// AgreedError on every rank, naming the rank.
class LocalFault {
 public:
  template <class F>
  void run(F&& f) {
    if (!error_.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }
  void settle(MPI_Comm comm) const { agree_or_throw(comm, error_); }

 private:
  std::string error_;
};

// A duplicate of the caller's communicator for the length of one call, so the ring's messages
// cannot match the caller's own traffic.
class CommDup {
 public:
  explicit CommDup(MPI_Comm comm);
  ~CommDup();
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace qkv::ring
