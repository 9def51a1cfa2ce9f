// `qkv attend --ring`: shard reading from mapped .npy files, the ring call, and the collective
// atomic write of the sharded output.
#include "ring/attend_ring.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "io/atomic_replace.h"
#include "io/mapped_file.h"
#include "io/npy_header.h"
#include "qkv/distributed.h"

namespace qkv::cli {
namespace {

constexpr Sharding kSharding = Sharding::zigzag;

// MPI for the length of one command; finalized on the way out, error or not.
class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw Error("--ring: MPI_Init failed");
    owned_ = true;
  }
  ~MpiSession() {
    if (owned_) MPI_Finalize();
  }

 private:
  bool owned_ = false;
};

// One rank's tokens of a [.., L, C] float32 .npy, as [A0, A1, n, C], and the file's shape.
struct Shard {
  std::vector<int64_t> file_shape;
  Tensor<float> data;
};

Shard read_shard(const std::string& path, const char* option, int ranks, int rank) {
  detail::MappedFile file(path);
  const detail::NpyHeader h = detail::parse_npy_header(file.bytes(), path);
  if (h.type != detail::NpyType::f4 || h.info.fortran_order)
    throw Error(fmt::format("{} {}: --ring reads C-order float32 .npy files, got '{}'{}", option, path, h.info.descr,
                            h.info.fortran_order ? " in Fortran order" : ""));
  const std::vector<int64_t>& s = h.info.shape;
  if (s.size() < 2 || s.size() > 4)
    throw Error(
        fmt::format("{} {}: expected [N, D], [H, N, D] or [B, H, N, D], got {}", option, path, shape_string(s)));
  std::array<int64_t, 4> s4{1, 1, 1, 1};
  std::copy(s.begin(), s.end(), s4.end() - static_cast<std::ptrdiff_t>(s.size()));
  const int64_t L = s4[2], C = s4[3];
  Shard shard{s, Tensor<float>({s4[0], s4[1], shard_length(L, ranks, rank, kSharding), C}, path)};
  const char* base = file.data() + h.data_offset;
  float* dst = shard.data.data();
  // Only this rank's rows are touched, so only their pages are read from the file.
  for (int64_t a = 0; a < s4[0] * s4[1]; ++a)
    for (const TokenRange& r : shard_ranges(L, ranks, rank, kSharding)) {
      const std::size_t bytes = static_cast<std::size_t>(r.size() * C) * sizeof(float);
      std::memcpy(dst, base + static_cast<std::size_t>((a * L + r.begin) * C) * sizeof(float), bytes);
      dst += r.size() * C;
    }
  // The element is named by its place in the file, as a single-process run names it.
  check_finite(shard.data.cview(), fmt::format("{} {}", option, path), false, [&](std::vector<int64_t>& index) {
    int64_t n = index[2];
    for (const TokenRange& r : shard_ranges(L, ranks, rank, kSharding)) {
      if (n < r.size()) {
        index[2] = r.begin + n;
        break;
      }
      n -= r.size();
    }
    index.erase(index.begin(), index.begin() + static_cast<std::ptrdiff_t>(4 - s.size()));  // the file's rank
  });
  return shard;
}

// The file shape of an output: q's leading dims, then `tail` (Dv, or nothing for lse).
std::vector<int64_t> output_shape(const std::vector<int64_t>& q_shape, std::optional<int64_t> tail) {
  std::vector<int64_t> shape(q_shape.begin(), q_shape.end() - 1);
  if (tail) shape.push_back(*tail);
  return shape;
}

void pwrite_all(int fd, const char* data, std::size_t bytes, off_t offset, const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, data, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(fmt::format("cannot write {}: {}", path, detail::errno_text(errno)));
    data += n, bytes -= static_cast<std::size_t>(n), offset += n;
  }
}

std::string attempt(const std::function<void()>& f) {
  try {
    f();
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

// The outputs of one run: each is written by every rank into a temporary file beside it, and
// rank 0 renames them all into place only after every rank wrote every row; any failure on any
// rank removes the temporary files (and outputs renamed by this run), so nothing partial remains.
class ShardedOutputs {
 public:
  ShardedOutputs(MPI_Comm comm, int ranks, int rank) : comm_(comm), ranks_(ranks), rank_(rank) {
    // Rank 0's pid names the temporary files (io's form, .NAME.tmp-PID-...), so a stale file from a
    // killed run is never reused, and the next write of the same output removes it.
    tag_ = static_cast<int>(::getpid());
    MPI_Bcast(&tag_, 1, MPI_INT, 0, comm_);
  }
  ~ShardedOutputs() {
    if (rank_ == 0)
      for (const auto& [tmp, path] : staged_) ::unlink(tmp.c_str());
  }

  // Every rank's shard [A0, A1, n, C] of a sequence of L tokens into one .npy of `file_shape`.
  void write(const std::string& path, const std::vector<int64_t>& file_shape, const Tensor<float>& shard, int64_t L) {
    const std::string header = detail::npy_header_bytes("<f4", file_shape);
    const std::string tmp = detail::temporary_name(path, tag_, 0, 0);
    const int64_t C = shard.dim(3), A = shard.dim(0) * shard.dim(1);
    agree(rank_ != 0 ? std::string() : attempt([&] {
      detail::remove_stale_temporaries(path);
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd < 0) throw Error(fmt::format("cannot create {}: {}", tmp, detail::errno_text(errno)));
      staged_.emplace_back(tmp, path);
      const off_t size = static_cast<off_t>(header.size() + static_cast<std::size_t>(A * L * C) * sizeof(float));
      const bool ok = ::ftruncate(fd, size) == 0;
      ::close(fd);
      if (!ok) throw Error(fmt::format("cannot size {}: {}", tmp, detail::errno_text(errno)));
    }));
    agree(attempt([&] {
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) throw Error(fmt::format("cannot open {}: {}", tmp, detail::errno_text(errno)));
      try {
        if (rank_ == 0) pwrite_all(fd, header.data(), header.size(), 0, tmp);
        const float* src = shard.data();
        for (int64_t a = 0; a < A; ++a)
          for (const TokenRange& r : shard_ranges(L, ranks_, rank_, kSharding)) {
            const auto at = static_cast<off_t>(header.size() + static_cast<std::size_t>((a * L + r.begin) * C) * 4);
            pwrite_all(fd, reinterpret_cast<const char*>(src), static_cast<std::size_t>(r.size() * C) * 4, at, tmp);
            src += r.size() * C;
          }
        if (::fsync(fd) != 0) throw Error(fmt::format("cannot write {}: fsync: {}", tmp, detail::errno_text(errno)));
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }));
  }

  // Renames every staged file into place (rank 0), or removes them all if one rename fails.
  void commit() {
    std::vector<std::string> renamed;
    agree(rank_ != 0 ? std::string() : attempt([&] {
      for (const auto& [tmp, path] : staged_) {
        if (::rename(tmp.c_str(), path.c_str()) != 0) {
          const std::string reason = detail::errno_text(errno);
          for (const std::string& done : renamed) ::unlink(done.c_str());
          throw Error(fmt::format("cannot write {}: rename: {}", path, reason));
        }
        renamed.push_back(path);
      }
    }));
    staged_.clear();
  }

 private:
  void agree(const std::string& error) { agree_or_throw(comm_, error); }

  MPI_Comm comm_;
  int ranks_, rank_, tag_ = 0;
  std::vector<std::pair<std::string, std::string>> staged_;  // (temporary, final), rank 0 only
};

// "" if every (name, value) of `facts` is rank 0's too, else the first that is not; every rank
// calls it (one broadcast per fact).
std::string differs_from_rank0(MPI_Comm comm, int rank, const std::vector<std::pair<std::string, std::string>>& facts) {
  std::string error;
  for (const auto& [name, mine] : facts) {
    std::string theirs = mine;
    int length = static_cast<int>(theirs.size());
    MPI_Bcast(&length, 1, MPI_INT, 0, comm);
    theirs.resize(static_cast<std::size_t>(length));
    MPI_Bcast(theirs.data(), length, MPI_CHAR, 0, comm);
    if (rank != 0 && error.empty() && theirs != mine)
      error = fmt::format("{} differs between ranks: rank 0 has {}, this rank {}; every rank must be given the same",
                          name, theirs, mine);
  }
  return error;
}

void attend_ring(MPI_Comm comm, int ranks, int rank, const RingAttendArgs& a, MaskArgs& mask_args) {
  Shard q, k, v;
  RingOptions options;
  Tensor<float> out, lse;  // allocated before the agreement, which a rank without them joins
  std::string error;
  try {
    check_output_paths({{"--out", a.out}, {"--lse", a.lse}}, {{"--q", a.q},
                                                              {"--k", a.k},
                                                              {"--v", a.v},
                                                              {"--keep-mask", mask_args.keep_mask_path},
                                                              {"--bias", mask_args.bias_path}});
    q = read_shard(a.q, "--q", ranks, rank);
    k = read_shard(a.k, "--k", ranks, rank);
    v = read_shard(a.v, "--v", ranks, rank);
    if (q.file_shape.size() != k.file_shape.size() || q.file_shape.size() != v.file_shape.size())
      throw Error(
          fmt::format("--q {}, --k {}, --v {}: ranks differ; give all three as [N, D], [H, N, D] or "
                      "[B, H, N, D]",
                      a.q, a.k, a.v));
    const int64_t N = q.file_shape[q.file_shape.size() - 2], M = k.file_shape[k.file_shape.size() - 2];
    options.attention.mask = build_mask(mask_args, q.data.dim(0), q.data.dim(1), N, M);
    options.attention.scale = a.scale;
    options.attention.num_threads = a.threads;
    options.sharding = kSharding;
    out = Tensor<float>({q.data.dim(0), q.data.dim(1), q.data.dim(2), v.data.dim(3)}, "out");
    lse = Tensor<float>({q.data.dim(0), q.data.dim(1), q.data.dim(2), 1}, "lse");
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(comm, error);
  // Each rank reads its own shard of what it was given: files of other shapes would make the shards
  // pieces of different problems (a result that is silently wrong), and other outputs a different
  // sequence of collective writes (a rank waiting forever). The inputs' names may differ (a copy
  // per host); the outputs are written through one shared path.
  agree_or_throw(comm, differs_from_rank0(comm, rank,
                                          {{"the shape of --q", shape_string(q.file_shape)},
                                           {"the shape of --k", shape_string(k.file_shape)},
                                           {"the shape of --v", shape_string(v.file_shape)},
                                           {"--out", a.out},
                                           {"--lse", a.lse.empty() ? "no --lse" : a.lse}}));

  const TensorView<float> lse3(lse.data(), {lse.dim(0), lse.dim(1), lse.dim(2)});
  ring_attention_forward(comm, out.view(), lse3, q.data.cview(), k.data.cview(), v.data.cview(), options);
  error.clear();
  try {
    check_finite(out.cview(), "output of attention (inputs too large for float32)");
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(comm, error);
  const int64_t N = q.file_shape[q.file_shape.size() - 2];
  ShardedOutputs outputs(comm, ranks, rank);
  outputs.write(a.out, output_shape(q.file_shape, v.data.dim(3)), out, N);
  if (!a.lse.empty()) outputs.write(a.lse, output_shape(q.file_shape, std::nullopt), lse, N);
  outputs.commit();
}

}  // namespace

// An error all ranks agreed on is printed once, by rank 0, and every rank exits 1 only after that:
// mpirun ends the whole job as soon as one rank exits non-zero, which could cut rank 0 off before
// it had printed. Any other error is one rank's alone, with the others waiting on it in a
// collective: that rank prints it and aborts the job (MPI_Finalize would wait for them forever).
int run_attend_ring(const RingAttendArgs& a, MaskArgs& mask_args) {
  MpiSession session;
  MPI_Comm comm = MPI_COMM_WORLD;
  int ranks = 1, rank = 0;
  MPI_Comm_size(comm, &ranks);
  MPI_Comm_rank(comm, &rank);
  try {
    attend_ring(comm, ranks, rank, a, mask_args);
  } catch (const AgreedError& e) {
    if (rank == 0) print_error(e.what());
    MPI_Barrier(comm);
    return 1;
  } catch (const std::exception& e) {
    print_error(fmt::format("rank {}: {}", rank, e.what()));
    MPI_Abort(comm, 1);
  }
  return 0;
}

}  // namespace qkv::cli
