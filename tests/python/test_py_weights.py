"""qkv.attention_weights against torch.softmax of the masked scores (py_oracle.torch_scores)."""

import numpy as np
import pytest
import torch

import qkv
from py_oracle import assert_close, random_case, rng_for, seed_note, torch_scores


TOL = 2e-6  # weights are in [0, 1], computed in float64 and rounded to float32


def _torch_weights(q, k, mask):
    s = torch_scores(q, k, **mask)
    empty = (s == float("-inf")).all(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(empty, torch.zeros_like(s), s), dim=-1)
    return torch.where(empty, torch.zeros_like(p), p).numpy()


def _lead(q):
    return q.shape[:-2]


@pytest.mark.parametrize("case", range(10000, 10060))
def test_rows_match_torch(case):
    rng = rng_for(case)
    q, k, v, mask, desc = random_case(rng, np.float32)
    N = q.shape[-2]
    rows = [int(r) for r in rng.integers(0, N, size=int(rng.integers(1, 5)))]
    want = _torch_weights(q, k, mask)[..., rows, :].reshape(_lead(q) + (len(rows), k.shape[-2]))
    got = qkv.attention_weights(q, k, rows=rows, **mask)
    note = f"{seed_note(case)} rows={rows} {desc}"
    assert got.shape == want.shape and got.dtype == np.float32, note
    assert_close(got, want, TOL, note)


@pytest.mark.parametrize("case", range(10100, 10130))
def test_top_k_matches_torch(case):
    rng = rng_for(case)
    q, k, v, mask, desc = random_case(rng, np.float32)
    M = k.shape[-2]
    top = int(rng.integers(1, M + 2))
    full = _torch_weights(q, k, mask).reshape(_lead(q) + (q.shape[-2], M))
    values, indices = qkv.attention_weights(q, k, top_k=top, **mask)
    note = f"{seed_note(case)} top_k={top} {desc}"
    assert values.shape == indices.shape == _lead(q) + (q.shape[-2], top) and indices.dtype == np.int64, note
    allowed = np.isfinite(torch_scores(q, k, **mask).numpy()).reshape(full.shape)
    count = np.minimum(allowed.sum(axis=-1), top)
    for idx in np.ndindex(*full.shape[:-1]):
        n = count[idx]
        assert np.all(indices[idx][n:] == -1) and np.all(values[idx][n:] == 0), f"{idx} {note}"
        order = sorted(np.flatnonzero(allowed[idx]), key=lambda j: (-full[idx][j], j))[:n]
        # Equal weights may be ordered either way by rounding; the values must agree regardless.
        assert_close(values[idx][:n], full[idx][order], TOL, f"{idx} {note}")
        assert_close(full[idx][indices[idx][:n]], full[idx][order], TOL, f"{idx} {note}")


def test_given_lse_and_defaults():
    rng = rng_for(10200)
    q = rng.standard_normal((2, 4, 17, 40)).astype(np.float32)
    k = rng.standard_normal((2, 2, 65, 40)).astype(np.float32)
    v = rng.standard_normal((2, 2, 65, 3)).astype(np.float32)
    out, lse = qkv.scaled_dot_product_attention(q, k, v, causal=True, return_lse=True)
    with_lse = qkv.attention_weights(q, k, lse=lse, causal=True)
    without = qkv.attention_weights(q, k, causal=True)
    assert with_lse.shape == (2, 4, 17, 65)
    assert_close(with_lse, without, 1e-5, seed_note(10200))
    np.testing.assert_allclose(without.sum(axis=-1), 1.0, atol=1e-6)
    # The weights reproduce the output: out = weights @ v (per key/value head group).
    vv = np.repeat(v, 2, axis=1).astype(np.float64)
    assert_close(with_lse.astype(np.float64) @ vv, out, 1e-5, seed_note(10200))
    last = qkv.attention_weights(q[0, 0], k[0, 0], rows=-1)
    assert last.shape == (1, 65)
    assert np.array_equal(last, qkv.attention_weights(q[0, 0], k[0, 0], rows=[16]))


@pytest.mark.parametrize("top_k", [None, 3])
def test_a_given_lse_too_large_for_float32_is_replaced_by_the_rows_own(top_k):
    """A row under a -1e9 bias has lse about -1e9, which float32 holds to 64: exp(score - lse) put
    weights of 0.9-1.4 on 5 keys. Past 2^10 the row's own lse replaces a given one that is that
    row's (the backward's rule); one that is not is still refused."""
    rng = rng_for(10250)
    print(seed_note(10250))
    q = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    bias = np.zeros((1, 2, 6, 5), np.float32)
    bias[0, :, 1] = -1e9          # a whole row
    bias[0, 1, 3] = -3000.0       # past 2^10 by less
    bias[0, 0, 4, :2] = -1e9      # a part of a row: its lse stays ordinary
    _, lse = qkv.scaled_dot_product_attention(q, k, k, bias=bias, return_lse=True)
    assert np.abs(lse).max() > 1e8
    got = qkv.attention_weights(q, k, lse=lse, bias=bias, top_k=top_k)
    want = qkv.attention_weights(q, k, bias=bias, top_k=top_k)
    if top_k is None:
        assert_close(got, want, 2e-6, seed_note(10250))
        np.testing.assert_allclose(got.sum(axis=-1), 1.0, atol=1e-6)
    else:
        assert_close(got[0], want[0], 2e-6, seed_note(10250))
        assert np.array_equal(got[1], want[1])
    with pytest.raises(ValueError, match="attention_weights: the output overflowed float32"):
        qkv.attention_weights(q, k, lse=lse - 5000, bias=bias, top_k=top_k)


def test_fully_masked_rows_are_zero():
    rng = rng_for(10300)
    q = rng.standard_normal((3, 5)).astype(np.float32)
    w = qkv.attention_weights(q, q, query_lengths=2)
    assert np.all(w[2:] == 0) and np.allclose(w[:2].sum(axis=1), 1.0)
    values, indices = qkv.attention_weights(q, q, key_lengths=0, top_k=2)
    assert np.all(values == 0) and np.all(indices == -1)


def test_no_keys_give_empty_weights_without_listing_broadcast_rows():
    """M = 0: every row's weights are empty; a q broadcast over 2^30 rows costs nothing (rows=None
    listed all of them once, 8 GiB here), and given rows are still checked."""
    q = np.broadcast_to(np.ones((1, 8), np.float32), (2 ** 30, 8))
    none = np.zeros((0, 8), np.float32)
    assert qkv.attention_weights(q, none).shape == (2 ** 30, 0)
    assert qkv.attention_weights(q[:3], none, rows=[0, -1]).shape == (2, 0)
    with pytest.raises(ValueError, match=r"rows: index 5 is outside \[-3, 3\)"):
        qkv.attention_weights(q[:3], none, rows=[5])
    values, indices = qkv.attention_weights(q[:3], none, top_k=2)
    assert values.shape == (3, 2) and np.all(values == 0) and np.all(indices == -1)


@pytest.mark.parametrize("top_k", [None, 2])
def test_an_lse_that_makes_weights_overflow_is_refused_as_the_backward_refuses_it(top_k):
    rng = rng_for(10900)
    q = rng.standard_normal((1, 1, 2, 4)).astype(np.float32)
    k = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    out, lse = qkv.scaled_dot_product_attention(q, k, k, return_lse="float64")
    # The backward's rule (refuse_overflow): finite q, k and an lse without NaN explain no inf.
    for bad in (np.full_like(lse, -1e30), lse - 100):
        with pytest.raises(ValueError, match="attention_backward: the gradients overflowed float32"):
            qkv.attention_backward(q, k, k, np.ones_like(out), out=out, lse=bad)
        with pytest.raises(ValueError, match=r"attention_weights: the output overflowed float32 .*pass the lse the "
                                             r"forward returned"):
            qkv.attention_weights(q, k, lse=bad, top_k=top_k)
    # float64 lse beyond float32 is refused before it is rounded
    with pytest.raises(ValueError, match=r"lse: element -1e\+300 at index \(0, 0, 0\) overflows float32"):
        qkv.attention_weights(q, k, lse=np.full_like(lse, -1e300), top_k=top_k)
    # The forward's own lse, a larger one (weights below 1) and -inf for fully masked rows still pass.
    qkv.attention_weights(q, k, lse=lse, top_k=top_k)
    qkv.attention_weights(q, k, lse=lse + 50, top_k=top_k)
    masked = np.zeros((2, 3), bool)
    masked[1] = True
    _, lse_m = qkv.scaled_dot_product_attention(q, k, k, keep_mask=masked, return_lse="float64")
    assert lse_m[0, 0, 0] == -np.inf
    w = qkv.attention_weights(q, k, lse=lse_m, keep_mask=masked, top_k=top_k)
    assert np.all(np.asarray(w[0] if top_k else w)[0, 0, 0] == 0)


@pytest.mark.parametrize("top_k", [None, 2])
@pytest.mark.parametrize("value, word", [(np.nan, "NaN"), (np.inf, r"\+inf")])
def test_a_nan_or_inf_lse_is_refused_naming_the_row_as_the_backward_refuses_it(top_k, value, word):
    rng = rng_for(10901)
    q = rng.standard_normal((2, 3, 4)).astype(np.float32)  # [H, N, D]: lse is [H, N]
    k = rng.standard_normal((2, 5, 4)).astype(np.float32)
    _, lse = qkv.scaled_dot_product_attention(q, k, k, return_lse="float64")
    lse[1, 2] = value
    tail = (r" although q and k are finite; no forward gives that \(a row's lse is finite, or -inf when the row has "
            r"no allowed key\): pass the lse the forward returned for these q, k, mask and scale, or no lse to "
            r"recompute it")
    with pytest.raises(ValueError, match=r"^attention_weights: the lse of query row 2 \(batch 0, head 1\) is " + word
                       + tail + "$"):
        qkv.attention_weights(q, k, lse=lse, top_k=top_k)
    # A row that is not chosen is not read; the chosen ones get the forward's weights.
    got = qkv.attention_weights(q, k, lse=lse, rows=[0, 1], top_k=top_k)
    want = qkv.attention_weights(q, k, rows=[0, 1], top_k=top_k)
    for g, w in zip(got if top_k else [got], want if top_k else [want]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
    # A NaN in q is the caller's own: its row's weights are NaN, as the composite's are.
    q[1, 2, 0] = np.nan
    w = qkv.attention_weights(q, k, lse=lse, rows=[2])
    assert np.isnan(w[1, 0]).all()


def test_rows_of_rank_2_are_refused_by_name():
    q = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError, match=r"rows\[0\] must be an integer, got array\(\[0\]\)"):
        qkv.attention_weights(q, q, rows=np.array([[0]]))


def test_weights_bad_inputs():
    q = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"rows: index 3 is outside \[-3, 3\)"):
        qkv.attention_weights(q, q, rows=[0, 3])
    with pytest.raises(TypeError, match="rows must be an int or a sequence of ints"):
        qkv.attention_weights(q, q, rows="0")
    with pytest.raises(TypeError, match=r"rows\[0\] must be an integer, got 1.5"):
        qkv.attention_weights(q, q, rows=[1.5])
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"attention_weights_topk: top_k must be at least 1, got {bad}"):
            qkv.attention_weights(q, q, top_k=bad)
    with pytest.raises(TypeError, match="top_k must be an integer"):
        qkv.attention_weights(q, q, top_k=2.0)
    with pytest.raises(ValueError, match=r"lse: shape \[2\] must be \[3\]"):
        qkv.attention_weights(q, q, lse=np.zeros(2, np.float32))
    # Only float arrays, as the forward returns lse (strings and ints were cast, complex truncated).
    for bad in (np.zeros(3).astype(str), np.zeros(3, np.int32), np.zeros(3, np.complex64)):
        with pytest.raises(TypeError, match=f"lse: dtype {bad.dtype} is not supported"):
            qkv.attention_weights(q, q, lse=bad)
    # numpy bools are not row indices, bytes are not a list of rows; a 0-d integer array is one row.
    with pytest.raises(TypeError, match=r"rows\[0\] must be an integer, got True"):
        qkv.attention_weights(q, q, rows=np.array([True, False, True]))
    with pytest.raises(TypeError, match="rows must be an int or a sequence of ints"):
        qkv.attention_weights(q, q, rows=b"\x01")
    assert qkv.attention_weights(q, q, rows=np.array(1)).shape == (1, 3)
    with pytest.raises(ValueError, match="must have the same last dim"):
        qkv.attention_weights(q, np.ones((3, 5), np.float32))
    with pytest.raises(TypeError, match="q: dtype int64 is not supported"):
        qkv.attention_weights(q.astype(np.int64), q)
