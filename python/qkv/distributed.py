"""Sequence-parallel ring attention across MPI ranks, on an mpi4py communicator.

    from mpi4py import MPI
    import qkv.distributed as qd
    comm = MPI.COMM_WORLD
    q_s, k_s, v_s = (qd.shard(x, comm) for x in (q, k, v))   # this rank's tokens
    out_s, lse_s = qd.ring_attention(comm, q_s, k_s, v_s, causal=True, return_lse=True)
    dq_s, dk_s, dv_s = qd.ring_attention_backward(comm, dout_s, q_s, k_s, v_s, out_s, lse_s, causal=True)
    out = qd.unshard(out_s, comm)                              # the whole sequence, on every rank

Every rank calls each function together (collective). Arrays are this rank's shard, float32 (other
float dtypes are converted), shaped [..., n, D] with rank 2, 3 or 4 like qkv.scaled_dot_product_attention;
the sequence is cut by `sharding`: "zigzag" (default; rank r holds chunks r and 2P-1-r of 2P, which
balances a causal mask) or "contiguous". Masks use GLOBAL positions: causal (with causal_align),
window, key_lengths, query_lengths, alibi_slopes, softcap. keep_mask and bias are not supported.
A bad argument on any rank raises the same ValueError on every rank (no rank is left waiting).
For a fixed number of ranks the results are bitwise the same for any num_threads.
"""

import numpy as np

from . import _qkv

try:
    from . import _qkv_distributed as _d
except ImportError as e:  # qkv was built without MPI, or the MPI runtime is not installed
    raise ImportError(
        "qkv.distributed needs qkv built with MPI and the MPI runtime: on Debian, "
        "`sudo apt-get install libopenmpi-dev openmpi-bin python3-mpi4py`, then rebuild and reinstall qkv "
        f"(pip install --no-build-isolation ... builds the ring module when MPI is found); cause: {e}") from e


def _comm_address(comm):
    from mpi4py import MPI
    return MPI._addressof(comm)


def shard_ranges(length, ranks, rank, sharding="zigzag"):
    """The [begin, end) token ranges of `rank`, in the order they are stored in its shard."""
    return _qkv._shard_ranges(_qkv._index_arg(length, "length"), _qkv._index_arg(ranks, "ranks"),
                           _qkv._index_arg(rank, "rank"), sharding)


def shard(x, comm, sharding="zigzag"):
    """This rank's tokens (axis -2) of a whole sequence x [..., L, C]."""
    ranges = shard_ranges(x.shape[-2], comm.Get_size(), comm.Get_rank(), sharding)
    return np.concatenate([x[..., b:e, :] for b, e in ranges], axis=-2)


def unshard(x, comm, sharding="zigzag"):
    """The whole sequence, on every rank, from each rank's shard x [..., n, C] (an allgather)."""
    parts = comm.allgather(np.ascontiguousarray(x))
    length = sum(p.shape[-2] for p in parts)
    full = np.empty(x.shape[:-2] + (length, x.shape[-1]), dtype=x.dtype)
    for r, part in enumerate(parts):
        offset = 0
        for b, e in shard_ranges(length, len(parts), r, sharding):
            full[..., b:e, :] = part[..., offset:offset + e - b, :]
            offset += e - b
    return full


def _as4(x, name):
    x = np.asarray(x)
    if x.ndim < 2 or x.ndim > 4:
        raise ValueError(f"{name}: expected [n, D], [H, n, D] or [B, H, n, D], got shape {x.shape}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _options(causal, causal_align, window, key_lengths, query_lengths, alibi_slopes, softcap, scale, num_threads,
             sharding):
    # The main module's checks, so nothing is truncated or taken as truthy (1.5 as 1, "no" as True).
    def ints(x, name):
        return [] if x is None else [_qkv._index_arg(v, f"{name}[{i}]") for i, v in enumerate(np.atleast_1d(x))]
    if window is not None:
        window = tuple(-1 if window[i] is None else _qkv._index_arg(window[i], f"window[{i}]") for i in (0, 1))
    slopes = [] if alibi_slopes is None else [_qkv._number_arg(s, f"alibi_slopes[{i}]")
                                              for i, s in enumerate(alibi_slopes)]
    return _qkv._ring_options(_qkv._flag_arg(causal, "causal"), causal_align, window, ints(key_lengths, "key_lengths"),
                           ints(query_lengths, "query_lengths"), slopes,
                           0.0 if softcap is None else _qkv._number_arg(softcap, "softcap"), _qkv._scale_arg(scale),
                           _qkv._threads_arg(num_threads), sharding)


def ring_attention(comm, q, k, v, *, causal=False, causal_align="top_left", window=None, key_lengths=None,
                   query_lengths=None, alibi_slopes=None, softcap=None, scale=None, sharding="zigzag", num_threads=0,
                   return_lse=False):
    """Attention of this rank's queries over the whole (sharded) key sequence.

    Returns out [..., n, Dv] (float32), or (out, lse) with lse [..., n] if return_lse."""
    q4, k4, v4 = _as4(q, "q"), _as4(k, "k"), _as4(v, "v")
    opts = _options(causal, causal_align, window, key_lengths, query_lengths, alibi_slopes, softcap, scale,
                    num_threads, sharding)
    out, lse = _d.forward(_comm_address(comm), q4, k4, v4, opts)
    lead = np.shape(q)[:-1]
    out = out.reshape(lead + (out.shape[-1],))
    return (out, lse.reshape(lead)) if return_lse else out


def ring_attention_backward(comm, dout, q, k, v, out, lse, *, causal=False, causal_align="top_left", window=None,
                            key_lengths=None, query_lengths=None, alibi_slopes=None, softcap=None, scale=None,
                            sharding="zigzag", num_threads=0):
    """Gradients (dq, dk, dv) of this rank's shards, given dout and the forward's out and lse."""
    q4, k4, v4 = _as4(q, "q"), _as4(k, "k"), _as4(v, "v")
    lse3 = np.asarray(lse).reshape(q4.shape[:3])
    opts = _options(causal, causal_align, window, key_lengths, query_lengths, alibi_slopes, softcap, scale,
                    num_threads, sharding)
    dq, dk, dv = _d.backward(_comm_address(comm), _as4(dout, "dout"), q4, k4, v4, _as4(out, "out"), lse3, opts)
    return dq.reshape(np.shape(q)), dk.reshape(np.shape(k)), dv.reshape(np.shape(v))
