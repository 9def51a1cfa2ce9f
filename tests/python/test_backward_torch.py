"""qkv.attention_backward against torch autograd on softmax(q @ k^T * scale + mask) @ v.

The masks' meaning comes from py_oracle.torch_scores (the additive ALiBi term and the -inf pattern of
every mask kind); the differentiable part (q @ k^T, softcap, bias, softmax, @ v) is spelled out
here in float64 torch so autograd gives dq, dk, dv and dbias. Errors are measured relative to
max |grad| per tensor, floored at 0.1: a row whose allowed set is one key has an exactly zero
gradient by cancellation, and fp32 leaves rounding noise there.
"""

import numpy as np
import pytest
import torch

import qkv
from py_oracle import as4, random_case, rng_for, seed_note, torch_scores

FP32_TOL = 2e-4
FP64_TOL = 1e-10


def autograd_grads(q, k, v, dout, mask):
    """(dq, dk, dv, dbias or None) of sum(dout * attention) by torch autograd in float64."""
    structural = {key: val for key, val in mask.items() if key not in ("softcap", "bias", "scale")}
    # Zero q, k: the oracle's scores are then exactly the ALiBi term where allowed, -inf elsewhere.
    additive = torch_scores(np.zeros(q.shape), np.zeros(k.shape), **structural)
    qt = as4(q).double().requires_grad_()
    kt = as4(k).double().requires_grad_()
    vt = as4(v).double().requires_grad_()
    H, D = qt.shape[1], qt.shape[3]
    group = H // kt.shape[1]
    scale = mask.get("scale") or 1.0 / np.sqrt(D)
    s = (qt @ kt.repeat_interleave(group, dim=1).transpose(-1, -2)) * scale
    if mask.get("softcap"):
        cap = float(np.float32(mask["softcap"]))
        s = cap * torch.tanh(s / cap)
    bias_t = None
    if mask.get("bias") is not None:
        bias_t = torch.tensor(np.asarray(mask["bias"], dtype=np.float32), dtype=torch.float64, requires_grad=True)
        s = s + bias_t
    s = s + additive
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(empty, torch.zeros_like(s), s), dim=-1)
    p = torch.where(empty, torch.zeros_like(p), p)
    out = p @ vt.repeat_interleave(group, dim=1)
    (out * as4(dout).double()).sum().backward()
    shaped = lambda t, like: t.detach().numpy().reshape(np.shape(like))
    dbias = None if bias_t is None else bias_t.grad.numpy()
    return shaped(qt.grad, q), shaped(kt.grad, k), shaped(vt.grad, v), dbias


def check(name, got, want, tol, note):
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}; {note}"
    assert np.all(np.isfinite(got)), f"{name}: non-finite gradient; {note}"
    scale = max(0.1, float(np.max(np.abs(want)))) if want.size else 1.0
    err = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
    assert err <= tol * scale, f"{name}: max |error| {err:.3g} > {tol:g} * {scale:.3g}; {note}"


def strided(x, rng):
    """The same values in a different memory layout (qkv must honour strides)."""
    if x.ndim >= 3 and rng.random() < 0.5:
        return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -2, -3)), -2, -3)
    if rng.random() < 0.5:
        return np.asfortranarray(x)
    return x


def run_case(case, dtype, tol):
    rng = rng_for(case)
    q, k, v, mask, desc = random_case(rng, dtype)
    dout = rng.standard_normal(q.shape[:-1] + (v.shape[-1],)).astype(dtype)
    q, k, v, dout = (strided(x, rng) for x in (q, k, v, dout))
    note = f"{seed_note(case)} {desc}"
    want = autograd_grads(q, k, v, dout, mask)
    with_bias = mask.get("bias") is not None
    got = qkv.attention_backward(q, k, v, dout, return_dbias=with_bias, **mask)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.dtype == dtype, f"{name} dtype {g.dtype}; {note}"
        check(name, g, w, tol, note)
    if with_bias:
        check("dbias", np.asarray(got[3]), want[3], tol, note)


@pytest.mark.parametrize("case", range(1000, 1320))
def test_backward_matches_torch_float32(case):
    run_case(case, np.float32, FP32_TOL)


@pytest.mark.parametrize("case", range(2000, 2060))
def test_reference_backward_matches_torch_float64(case):
    run_case(case, np.float64, FP64_TOL)


def test_fully_masked_rows_have_zero_gradients():
    rng = rng_for(7)
    q = rng.standard_normal((2, 2, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 1, 6, 8)).astype(np.float32)
    v = rng.standard_normal((2, 1, 6, 4)).astype(np.float32)
    dout = rng.standard_normal((2, 2, 5, 4)).astype(np.float32)
    dq, dk, dv = qkv.attention_backward(q, k, v, dout, key_lengths=[0, 6], query_lengths=[5, 2])
    for g in (dq, dk, dv):
        assert np.all(np.isfinite(g)), seed_note(7)
    assert np.all(dq[0] == 0) and np.all(dk[0] == 0) and np.all(dv[0] == 0), seed_note(7)
    assert np.all(dq[1, :, 2:] == 0) and np.any(dq[1, :, :2] != 0), seed_note(7)


def test_gradients_independent_of_thread_count():
    rng = rng_for(11)
    q = rng.standard_normal((1, 4, 150, 40)).astype(np.float32)
    k = rng.standard_normal((1, 2, 170, 40)).astype(np.float32)
    v = rng.standard_normal((1, 2, 170, 24)).astype(np.float32)
    dout = rng.standard_normal((1, 4, 150, 24)).astype(np.float32)
    runs = [qkv.attention_backward(q, k, v, dout, causal=True, causal_align="bottom_right", num_threads=t)
            for t in (1, 2, 3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert np.array_equal(a, b), seed_note(11)
