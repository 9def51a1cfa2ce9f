// Sequence-parallel attention over MPI (ring attention, Liu et al. 2023): each rank of a
// communicator holds a shard of the query sequence and a shard of the key/value sequence; the K/V
// shards travel around the ring (non-blocking sends overlapped with the local fused block
// computation) and the partial outputs merge by log-sum-exp. Built only when CMake finds MPI
// (library qkv_distributed). Letters as in attention.h; N and M are the GLOBAL sequence lengths.
#pragma once

// MPI_Comm is in the signatures, so mpi.h is needed; its C++ bindings are not (qkv uses the C
// API), and OpenMPI's trip -Wcast-function-type, failing a consumer built with -Werror.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

#include "qkv/attention.h"
#include "qkv/sharding.h"

namespace qkv {

// Forward ring attention. On every rank of `comm` (a collective call; every rank must call it
// with the same options): q [B,H,Nr,D], k [B,Hkv,Mr,D], v [B,Hkv,Mr,Dv] hold the tokens
// shard_ranges(N, P, rank) and shard_ranges(M, P, rank) of the global sequences, where N and M
// are the sums of Nr and Mr over the ranks. out [B,H,Nr,Dv] and lse [B,H,Nr] (may be empty) receive
// this rank's rows of attention over the whole sequence. Any strides.
// Partials merge in fp32 in ring order, so for a fixed rank count the result is bitwise the same
// for any thread count and run. Memory per rank: O((Nr + Mr)·(D + Dv)·B·H), never N×M or N·D.
// Errors: a bad argument on ANY rank (shapes, options, shard sizes that do not match the layout,
// ranks that disagree on B, H, Hkv, D, Dv or the options) makes every rank throw AgreedError with
// a message naming the first failing rank; no rank is left waiting. An MPI failure throws
// qkv::Error (on the ranks that see it).
// Thread safety: the calling thread alone makes MPI calls (MPI_THREAD_FUNNELED suffices).
void ring_attention_forward(MPI_Comm comm, TensorView<float> out, TensorView<float> lse, TensorView<const float> q,
                            TensorView<const float> k, TensorView<const float> v, const RingOptions& options = {});

// Backward ring attention: dq [B,H,Nr,D], dk [B,Hkv,Mr,D], dv [B,Hkv,Mr,Dv] are overwritten with
// this rank's shard of the gradients, given dout and the forward's out and lse (lse required).
// dK/dV travel the ring with their K/V shard and are summed in ring order; P is recomputed from lse.
// Same collective, determinism and error contract as the forward.
void ring_attention_backward(MPI_Comm comm, TensorView<float> dq, TensorView<float> dk, TensorView<float> dv,
                             TensorView<const float> dout, TensorView<const float> q, TensorView<const float> k,
                             TensorView<const float> v, TensorView<const float> out, TensorView<const float> lse,
                             const RingOptions& options = {});

// Collective error agreement for code around the ring (file loading, CLI): every rank passes its
// own status (empty = ok); if any rank failed, every rank throws AgreedError carrying the first
// failing rank's message ("rank r: ..."). Returns normally on every rank only if all succeeded.
void agree_or_throw(MPI_Comm comm, const std::string& local_error);

}  // namespace qkv
