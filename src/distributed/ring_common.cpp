// The agreement of a ring call over MPI and its transfers.
#include "distributed/ring_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>

#include "qkv/out_of_memory.h"

namespace qkv {

void agree_or_throw(MPI_Comm comm, const std::string& local_error) {
  // Fixed-size slots so one allgather carries every rank's verdict and message.
  constexpr int kSlot = 1024;
  int ranks = 1;
  ring::check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  std::array<char, kSlot> mine{};
  if (!local_error.empty()) {
    mine[0] = 1;
    std::memcpy(mine.data() + 1, local_error.data(), std::min<std::size_t>(local_error.size(), kSlot - 2));
  }
  std::vector<char> all(static_cast<std::size_t>(ranks) * kSlot);
  ring::check_mpi(MPI_Allgather(mine.data(), kSlot, MPI_CHAR, all.data(), kSlot, MPI_CHAR, comm), "MPI_Allgather");
  for (int r = 0; r < ranks; ++r) {
    const char* slot = all.data() + static_cast<std::size_t>(r) * kSlot;
    if (slot[0] != 0) throw AgreedError(fmt::format("rank {}: {}", r, slot + 1));
  }
}

namespace ring {
namespace {

constexpr int64_t kMaxMessage = int64_t{1} << 30;

// Posts `count` floats as messages of at most kMaxMessage each (an MPI count is an int) through
// post(offset, n, &request), keeping every request for Transfers::wait.
template <class Post>
void post_chunks(std::vector<MPI_Request>& requests, int64_t count, const char* what, Post post) {
  for (int64_t done = 0; done < count; done += kMaxMessage) {
    MPI_Request request;
    check_mpi(post(done, static_cast<int>(std::min(kMaxMessage, count - done)), &request), what);
    requests.push_back(request);
  }
}

}  // namespace

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(fmt::format("{} failed: {}", what, text));
}

Plan make_plan(MPI_Comm comm, TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
               const RingOptions& options, const std::function<void(const AttentionShape&)>& local_checks) {
  int ranks = 1, rank = 0;
  check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  PlanRow mine{};
  std::string error;
  try {
    mine = plan_row(q, k, v, options, local_checks);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(comm, error);
  std::vector<int64_t> table(static_cast<std::size_t>(ranks) * kPlanFields);
  check_mpi(MPI_Allgather(mine.data(), kPlanFields, MPI_INT64_T, table.data(), kPlanFields, MPI_INT64_T, comm),
            "MPI_Allgather");
  return plan_from_table(table, ranks, rank, options);
}

void Transfers::send(const float* data, int64_t count, int to, int tag, MPI_Comm comm) {
  post_chunks(requests_, count, "MPI_Isend",
              [&](int64_t at, int n, MPI_Request* r) { return MPI_Isend(data + at, n, MPI_FLOAT, to, tag, comm, r); });
}

void Transfers::recv(float* data, int64_t count, int from, int tag, MPI_Comm comm) {
  post_chunks(requests_, count, "MPI_Irecv", [&](int64_t at, int n, MPI_Request* r) {
    return MPI_Irecv(data + at, n, MPI_FLOAT, from, tag, comm, r);
  });
}

void Transfers::send_shard(const Plan& plan, int r, ShardAt shard, int to, int tag, MPI_Comm comm) {
  send(shard.k, plan.k_floats(r), to, tag, comm);
  send(shard.v, plan.v_floats(r), to, tag, comm);
}

void Transfers::recv_shard(const Plan& plan, int r, float* k, float* v, int from, int tag, MPI_Comm comm) {
  recv(k, plan.k_floats(r), from, tag, comm);
  recv(v, plan.v_floats(r), from, tag, comm);
}

void Transfers::wait() {
  if (requests_.empty()) return;
  const int rc = MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  requests_.clear();
  check_mpi(rc, "MPI_Waitall");
}

void Transfers::poll(double seconds) {
  const double until = MPI_Wtime() + seconds;
  int done = 0;
  while (!requests_.empty() && !done) {
    check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (done) requests_.clear();
    if (MPI_Wtime() > until) break;
  }
}

Transfers::~Transfers() {
  // Only reached with requests outstanding when an exception unwinds; the buffers die with us.
  for (MPI_Request& r : requests_) {
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
}

CommDup::CommDup(MPI_Comm comm) { check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup"); }
CommDup::~CommDup() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

}  // namespace ring
}  // namespace qkv
