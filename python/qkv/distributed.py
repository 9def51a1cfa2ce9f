"""Sequence-parallel ring attention across MPI ranks, on an mpi4py communicator.

    from mpi4py import MPI
    import qkv.distributed as qd
    comm = MPI.COMM_WORLD
    q_s, k_s, v_s = (qd.shard(x, comm) for x in (q, k, v))   # this rank's tokens
    out_s, lse_s = qd.ring_attention(comm, q_s, k_s, v_s, causal=True, return_lse=True)
    dq_s, dk_s, dv_s = qd.ring_attention_backward(comm, dout_s, q_s, k_s, v_s, out_s, lse_s, causal=True)
    out = qd.unshard(out_s, comm)                              # the whole sequence, on every rank

Every rank calls each function together (collective). Arrays are this rank's shard, float32 (or
float64, rounded; a value past float32's range is refused), shaped [..., n, D] with rank 2, 3 or 4 like qkv.scaled_dot_product_attention;
the sequence is cut by `sharding`: "zigzag" (default; rank r holds chunks r and 2P-1-r of 2P, which
balances a causal mask) or "contiguous". Masks use GLOBAL positions: causal (with causal_align),
window, key_lengths, query_lengths, alibi_slopes, softcap, and so does dropout's keep-mask (dropout_p,
seed, dropout_offset). keep_mask and bias are not supported.
A bad argument on any rank raises the same error on every rank, "rank r: ..." naming the first rank
that refused its arguments (ValueError; TypeError for an argument of the wrong type), so no rank is
left waiting: the ranks agree on their checks before any other message of the call.
For a fixed number of ranks the results are bitwise the same for any num_threads.
"""

import builtins

import numpy as np

from . import _qkv  # noqa: F401 (registers the ring options type _qkv_distributed takes)
from ._ring import as4 as _as4, options as _options, place_shards as _place_shards, shard_ranges  # noqa: F401

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


def shard(x, comm, sharding="zigzag"):
    """This rank's tokens (axis -2) of a whole sequence x [..., L, C]."""
    ranges = shard_ranges(x.shape[-2], comm.Get_size(), comm.Get_rank(), sharding)
    return np.concatenate([x[..., b:e, :] for b, e in ranges], axis=-2)


def unshard(x, comm, sharding="zigzag"):
    """The whole sequence, on every rank, from each rank's shard x [..., n, C] (an allgather)."""
    parts = comm.allgather(np.ascontiguousarray(x))
    length = sum(p.shape[-2] for p in parts)
    return _place_shards(np.empty(x.shape[:-2] + (length, x.shape[-1]), dtype=x.dtype), parts, sharding)


def _agree(comm, check):
    """check() on every rank, then one allgather on comm, before any other message of the call:
    check's result when no rank raised, else on every rank the same error, of the first failing
    rank's type, "rank r: <its message>" (naming the other ranks that failed, if any)."""
    try:
        result, error = check(), None
    except Exception as e:  # noqa: BLE001 (any local failure must reach the other ranks, not leave them waiting)
        result, error = None, (type(e).__name__, str(e))
    errors = comm.allgather(error)
    failed = [r for r, e in enumerate(errors) if e is not None]
    if not failed:
        return result
    name, message = errors[failed[0]]
    kind = getattr(builtins, name, None)
    if not (isinstance(kind, type) and issubclass(kind, Exception)):
        kind, message = ValueError, f"{name}: {message}"
    also = ", ".join(map(str, failed[1:]))
    others = "" if not also else f" ({'ranks' if len(failed) > 2 else 'rank'} {also} also failed)"
    raise kind(f"rank {failed[0]}: {message}{others}")


def _f32(x, name):
    """x [n, D], [H, n, D] or [B, H, n, D] as a C-contiguous float32 [B, H, n, D] array (no copy
    when it is one already), by the main module's rule (float32, or float64 rounded to it, a value
    past float32's range refused): converted here, not by the compiled call, so a failure is agreed on."""
    return _qkv._float32_array(_as4(x, name), name)


def ring_attention(comm, q, k, v, *, causal=False, causal_align="top_left", window=None, key_lengths=None,
                   query_lengths=None, alibi_slopes=None, softcap=None, scale=None, sharding="zigzag", num_threads=0,
                   return_lse=False, dropout_p=0.0, seed=None, dropout_offset=0):
    """Attention of this rank's queries over the whole (sharded) key sequence.

    Dropout (dropout_p, seed, dropout_offset) drops the weights that scaled_dot_product_attention
    with the same three values drops on the whole sequence; every rank passes the same seed.
    Returns out [..., n, Dv] (float32), or (out, lse) with lse [..., n] if return_lse."""
    def check():
        arrays = _f32(q, "q"), _f32(k, "k"), _f32(v, "v")
        return arrays, _options(causal, causal_align, window, key_lengths, query_lengths, alibi_slopes, softcap,
                                scale, num_threads, sharding, dropout_p, seed, dropout_offset)
    (q4, k4, v4), opts = _agree(comm, check)
    out, lse = _d.forward(_comm_address(comm), q4, k4, v4, opts)
    lead = np.shape(q)[:-1]
    out = out.reshape(lead + (out.shape[-1],))
    return (out, lse.reshape(lead)) if return_lse else out


def ring_attention_backward(comm, dout, q, k, v, out, lse, *, causal=False, causal_align="top_left", window=None,
                            key_lengths=None, query_lengths=None, alibi_slopes=None, softcap=None, scale=None,
                            sharding="zigzag", num_threads=0, dropout_p=0.0, seed=None, dropout_offset=0):
    """Gradients (dq, dk, dv) of this rank's shards, given dout and the forward's out and lse (and
    the forward's dropout_p, seed and dropout_offset, whose mask it regenerates)."""
    def check():
        q4 = _f32(q, "q")
        lse3 = _qkv._float32_array(np.asarray(lse), "lse")
        if lse3.size != np.prod(q4.shape[:3]):
            raise ValueError(f"lse: expected q's shape without D, {np.shape(q)[:-1]}, got shape {lse3.shape}")
        arrays = _f32(dout, "dout"), q4, _f32(k, "k"), _f32(v, "v"), _f32(out, "out"), lse3.reshape(q4.shape[:3])
        return arrays, _options(causal, causal_align, window, key_lengths, query_lengths, alibi_slopes, softcap,
                                scale, num_threads, sharding, dropout_p, seed, dropout_offset)
    (dout4, q4, k4, v4, out4, lse3), opts = _agree(comm, check)
    dq, dk, dv = _d.backward(_comm_address(comm), dout4, q4, k4, v4, out4, lse3, opts)
    return dq.reshape(np.shape(q)), dk.reshape(np.shape(k)), dv.reshape(np.shape(v))
