"""The ring's arguments, shared by qkv.distributed (MPI) and qkv.torch's ring (torch.distributed):
which tokens a rank holds and the options every rank must agree on."""

import numpy as np

from . import _qkv


def shard_ranges(length, ranks, rank, sharding="zigzag"):
    """The [begin, end) token ranges of `rank`, in the order they are stored in its shard."""
    return _qkv._shard_ranges(_qkv._index_arg(length, "length"), _qkv._index_arg(ranks, "ranks"),
                              _qkv._index_arg(rank, "rank"), sharding)


def place_shards(full, parts, sharding):
    """Writes each rank's shard parts[r] [..., n_r, C] into its rows of the whole sequence `full`
    [..., L, C] (numpy arrays or torch tensors alike); returns full."""
    length = full.shape[-2]
    for r, part in enumerate(parts):
        offset = 0
        for b, e in shard_ranges(length, len(parts), r, sharding):
            full[..., b:e, :] = part[..., offset:offset + e - b, :]
            offset += e - b
    return full


def as4(x, name):
    """x [n, D], [H, n, D] or [B, H, n, D] (a numpy array, or a torch tensor as it is) as [B, H, n, D]."""
    if not hasattr(x, "ndim"):
        x = np.asarray(x)
    if x.ndim < 2 or x.ndim > 4:
        raise ValueError(f"{name}: expected [n, D], [H, n, D] or [B, H, n, D], got shape {x.shape}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def options(causal, causal_align, window, key_lengths, query_lengths, alibi_slopes, softcap, scale, num_threads,
            sharding, dropout_p=0.0, seed=None, dropout_offset=0):
    """The RingOptions of a call; ValueError / TypeError name a bad argument."""
    # The main module's checks, so nothing is truncated or taken as truthy (1.5 as 1, "no" as True).
    def ints(x, name):
        return [] if x is None else [_qkv._index_arg(v, f"{name}[{i}]") for i, v in enumerate(np.atleast_1d(x))]
    if window is not None:
        window = tuple(-1 if window[i] is None else _qkv._index_arg(window[i], f"window[{i}]") for i in (0, 1))
    slopes = [] if alibi_slopes is None else [_qkv._number_arg(s, f"alibi_slopes[{i}]")
                                              for i, s in enumerate(alibi_slopes)]
    return _qkv._ring_options(_qkv._flag_arg(causal, "causal"), causal_align, window,
                              ints(key_lengths, "key_lengths"), ints(query_lengths, "query_lengths"), slopes,
                              0.0 if softcap is None else _qkv._number_arg(softcap, "softcap"), _qkv._scale_arg(scale),
                              _qkv._threads_arg(num_threads), sharding,
                              dict(dropout_p=dropout_p, dropout_seed=seed, dropout_offset=dropout_offset))
