"""qkv.distributed under mpirun (ctest runs it with 3 ranks): ring attention on each rank's shard
against the single-process qkv kernel on the whole sequence, forward and backward, masks, GQA,
cross-attention, and a shape mismatch or a bad argument on one rank that must raise the same error
on every rank. The seed is broadcast from rank 0 and printed; replay with QKV_TEST_SEED=<seed>."""

import os
import re

import numpy as np
import pytest
from mpi4py import MPI

import qkv
import qkv.distributed as qd

COMM = MPI.COMM_WORLD.Dup()  # a communicator other than COMM_WORLD: the handle must be passed through


def _seed():
    seed = int(os.environ["QKV_TEST_SEED"]) if "QKV_TEST_SEED" in os.environ else int(np.random.SeedSequence().entropy % 2**32)
    seed = COMM.bcast(seed, root=0)
    print(f"QKV_TEST_SEED={seed}")
    return seed


def close(got, ref, what):
    tol = 2e-5 * (1 + np.max(np.abs(ref[np.isfinite(ref)]), initial=0.0))
    both_inf = np.isinf(ref) & (got == ref)
    with np.errstate(invalid="ignore"):  # -inf - -inf where both are -inf; masked by both_inf
        err = np.max(np.abs(np.where(both_inf, 0, got.astype(np.float64) - ref)), initial=0.0)
    assert err <= tol, f"{what}: max error {err:.3g} > {tol:.3g} (rank {COMM.Get_rank()})"


CASES = [
    dict(name="plain", shape=(1, 2, 2, 37, 37, 32, 32), mask={}),
    dict(name="causal zigzag GQA", shape=(2, 4, 2, 45, 45, 40, 24), mask=dict(causal=True)),
    dict(name="causal bottom-right cross", shape=(1, 2, 1, 13, 29, 16, 16),
         mask=dict(causal=True, causal_align="bottom_right")),
    dict(name="window + key lengths", shape=(2, 2, 2, 31, 31, 24, 24),
         mask=dict(window=(4, 2), key_lengths=[25, 0])),
    dict(name="contiguous causal", shape=(1, 1, 1, 20, 20, 59, 59), mask=dict(causal=True), sharding="contiguous"),
    # The keep-mask is keyed by global positions: the ring drops what the single call drops.
    dict(name="dropout causal", shape=(2, 2, 1, 33, 33, 16, 16),
         mask=dict(causal=True, dropout_p=0.25, seed=11, dropout_offset=2)),
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_ring_matches_single_process(case):
    B, H, Hkv, N, M, D, Dv = case["shape"]
    sharding = case.get("sharding", "zigzag")
    rng = np.random.default_rng([_seed(), len(case["name"])])
    q = rng.standard_normal((B, H, N, D), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, M, D), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, M, Dv), dtype=np.float32)
    dout = rng.standard_normal((B, H, N, Dv), dtype=np.float32)
    mask = case["mask"]
    out, lse = qkv.scaled_dot_product_attention(q, k, v, return_lse=True, **mask)
    dq, dk, dv = qkv.attention_backward(q, k, v, dout, out=out, lse=lse, **mask)

    sh = lambda x: qd.shard(x, COMM, sharding)  # noqa: E731
    out_s, lse_s = qd.ring_attention(COMM, sh(q), sh(k), sh(v), sharding=sharding, return_lse=True, **mask)
    close(out_s, sh(out), "out")
    close(lse_s[..., None], sh(lse[..., None]), "lse")
    grads = qd.ring_attention_backward(COMM, sh(dout), sh(q), sh(k), sh(v), out_s, lse_s, sharding=sharding, **mask)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, (dq, dk, dv)):
        close(got, sh(ref), name)
    # unshard gives every rank the whole output in sequence order.
    close(qd.unshard(out_s, COMM, sharding), out, "unsharded out")


def test_a_default_scale_and_the_same_scale_given_agree():
    rng = np.random.default_rng(_seed())
    x = rng.standard_normal((2, 30, 16), dtype=np.float32)
    xs = qd.shard(x, COMM)
    scale = None if COMM.Get_rank() == 0 else 1 / np.sqrt(16)
    got = qd.ring_attention(COMM, xs[0], xs[1], xs[1], scale=scale)
    close(got, qd.shard(qkv.scaled_dot_product_attention(x[0], x[1], x[1]), COMM), "out")


def test_rank_2d_inputs_and_threads_bitwise():
    rng = np.random.default_rng(_seed())
    x = rng.standard_normal((3, 50, 32), dtype=np.float32)
    xs = qd.shard(x, COMM)
    one = qd.ring_attention(COMM, xs[0], xs[1], xs[2], causal=True, num_threads=1)
    two = qd.ring_attention(COMM, xs[0], xs[1], xs[2], causal=True, num_threads=2)
    assert one.shape == xs[0].shape
    assert one.tobytes() == two.tobytes()


def test_mismatched_shapes_raise_on_every_rank():
    last = COMM.Get_size() - 1
    D = 8 if COMM.Get_rank() == last else 16
    n = sum(e - b for b, e in qd.shard_ranges(20, COMM.Get_size(), COMM.Get_rank()))
    x = np.zeros((1, 1, n, D), dtype=np.float32)
    with pytest.raises(ValueError, match=rf"rank {last} has \[B, H, Hkv, D, Dv\]"):
        qd.ring_attention(COMM, x, x, x)


def test_arguments_are_refused_by_name_not_coerced():
    """Checked on each rank before any message: a float length or window, a truthy string for
    causal, a float num_threads were truncated or taken as True before (int(), bool())."""
    n = sum(e - b for b, e in qd.shard_ranges(8, COMM.Get_size(), COMM.Get_rank()))
    x = np.zeros((1, 1, n, 4), dtype=np.float32)
    for kwargs, message in [(dict(causal="no"), "causal must be True or False, got 'no'"),
                            (dict(window=(1.5, None)), r"window\[0\] must be an integer, got 1.5"),
                            (dict(key_lengths=[2.5]), r"key_lengths\[0\] must be an integer, got 2.5"),
                            (dict(num_threads=1.5), "num_threads must be an integer, got 1.5"),
                            (dict(scale="x"), "scale must be a number or None, got 'x'")]:
        with pytest.raises(TypeError, match=message):
            qd.ring_attention(COMM, x, x, x, **kwargs)
    with pytest.raises(TypeError, match="length must be an integer, got 8.5"):
        qd.shard_ranges(8.5, COMM.Get_size(), COMM.Get_rank())


# Ranks 0 and 1 as a ring of their own (the other ranks of the run sit it out), and the whole run.
PAIR = COMM.Split(0 if COMM.Get_rank() < 2 else MPI.UNDEFINED, COMM.Get_rank())
ONE_RANK_BAD = [  # (name, forward or backward, what rank 1 alone changes, the error every rank raises)
    ("1-D q", "forward", dict(q=lambda q: q[0, 0, 0]), ValueError, r"q: expected \[n, D\], .* got shape \(4,\)"),
    ("causal_align", "forward", dict(causal=True, causal_align="bogus"), ValueError,
     "causal_align must be 'top_left' or 'bottom_right', got 'bogus'"),
    ("num_threads -1", "forward", dict(num_threads=-1), ValueError,
     r"num_threads must be >= 0 \(0 = default\), got -1"),
    ("num_threads 1.5", "forward", dict(num_threads=1.5), TypeError, "num_threads must be an integer, got 1.5"),
    ("q not numbers", "forward", dict(q=lambda q: np.full(q.shape, "x")), TypeError,
     r"q: dtype <U1 is not supported; pass float32 \(or float64"),
    ("k integers", "forward", dict(k=lambda k: k.astype(np.int64)), TypeError, "k: dtype int64 is not supported"),
    ("v past float32", "forward", dict(v=lambda v: np.full(v.shape, 1e300)), ValueError,
     r"v: element 1e\+300 at index \(0, 0, 0, 0\) overflows float32"),
    ("lse past float32", "backward", dict(lse=lambda lse: np.full(lse.shape, -1e300)), ValueError,
     r"lse: element -1e\+300 at index \(0, 0, 0\) overflows float32"),
    ("sharding", "forward", dict(sharding="striped"), ValueError, "sharding must be 'zigzag' or 'contiguous'"),
    # Checked by the compiled ring's own agreement, after this one.
    ("v one row short", "forward", dict(v=lambda v: v[..., 1:, :]), ValueError, "^rank 1: "),
    ("options differ", "forward", dict(key_lengths=[2]), ValueError,
     r"rank 1 was called with another mask \(causal, window, lengths, ALiBi, softcap\) than rank 0"),
    ("scale differs", "forward", dict(scale=0.25), ValueError, "rank 1 was called with another scale than rank 0"),
    ("dropout seed differs", "forward", dict(dropout_p=0.1, seed=5), ValueError,
     r"rank 1 was called with another dropout \(p, seed, offset\)"),
    ("1-D dout", "backward", dict(dout=lambda d: d[0, 0, 0]), ValueError, r"dout: expected \[n, D\]"),
    ("lse size", "backward", dict(lse=lambda lse: lse[..., 1:]), ValueError, "lse: expected q's shape without D"),
    ("backward num_threads", "backward", dict(num_threads=-1), ValueError, "num_threads must be >= 0"),
]


@pytest.mark.parametrize("ring", ["ranks 0 and 1", "every rank"])
@pytest.mark.parametrize("name, which, bad, kind, message", ONE_RANK_BAD, ids=[c[0] for c in ONE_RANK_BAD])
def test_a_bad_argument_on_rank_1_alone_raises_on_every_rank(ring, name, which, bad, kind, message):
    """Rank 1 alone passes the bad argument; every rank of the ring raises the same error naming
    rank 1, none waits for it. A rank that hangs instead is ended after 60 seconds, with its
    stack, which fails the run (mpirun ends the other ranks)."""
    import faulthandler
    comm = PAIR if ring == "ranks 0 and 1" else COMM
    got = None
    if comm != MPI.COMM_NULL:
        n = sum(e - b for b, e in qd.shard_ranges(6, comm.Get_size(), comm.Get_rank()))
        x = np.ones((1, 1, n, 4), dtype=np.float32)
        args = dict(q=x, k=x, v=x, dout=x, lse=np.zeros((1, 1, n), dtype=np.float32))
        kwargs = {}
        for key, value in (bad.items() if comm.Get_rank() == 1 else ()):
            if callable(value):
                args[key] = value(args[key])
            else:
                kwargs[key] = value
        faulthandler.dump_traceback_later(60, exit=True)
        try:
            if which == "forward":
                qd.ring_attention(comm, args["q"], args["k"], args["v"], **kwargs)
            else:
                qd.ring_attention_backward(comm, args["dout"], args["q"], args["k"], args["v"], x, args["lse"],
                                           **kwargs)
            got = ("returned", "")
        except Exception as e:  # noqa: BLE001 (compared below, on every rank)
            got = (type(e).__name__, str(e))
        finally:
            faulthandler.cancel_dump_traceback_later()
    results = COMM.allgather(got)
    ring_results = [g for g in results if g is not None]
    assert len(ring_results) == (2 if ring == "ranks 0 and 1" else COMM.Get_size())
    assert all(g == ring_results[0] for g in ring_results), f"{name}: the ranks disagree: {results}"
    assert ring_results[0][0] == kind.__name__, f"{name}: {results}"
    assert re.search(r"\brank 1\b", ring_results[0][1]), f"{name}: {results}"
    assert re.search(message, ring_results[0][1]), f"{name}: {results}"
