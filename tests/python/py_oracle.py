"""The PyTorch oracle for the Python-module tests, and seeded random attention cases.

torch_attention() spells out include/qkv/mask.h in plain torch operations on float64:
  scores = scale * q @ k^T; softcap c: c * tanh(scores / c); + bias; - slope[h] * |j - diag(i)|;
  then everything outside the allowed set becomes -inf and softmax(scores) @ v, where the allowed
  set is: j < M_b (key_lengths), i < N_b (query_lengths), j <= diag(i) (causal),
  diag(i) - left <= j <= diag(i) + right (window), keep_mask; diag(i) = i (top_left) or
  i + M_b - N_b (bottom_right). torch gives NaN for a row with no allowed key; qkv promises 0,
  so those rows are set to 0 (and their lse to -inf) here.
"""

import os
import random

import numpy as np
import torch

# One base seed per test session; every assertion message carries it (and the case number), so a
# failure replays with QKV_TEST_SEED=<seed>.
BASE_SEED = int(os.environ.get("QKV_TEST_SEED", random.SystemRandom().randrange(1, 2**31)))


def seed_note(case=None):
    return f"QKV_TEST_SEED={BASE_SEED}" + ("" if case is None else f" case={case}")


def rng_for(case):
    return np.random.default_rng([BASE_SEED, case])


def _lengths(lengths, B, full):
    if lengths is None:
        return torch.full((B,), full, dtype=torch.int64)
    if np.isscalar(lengths):
        return torch.full((B,), int(lengths), dtype=torch.int64)
    return torch.tensor(list(lengths), dtype=torch.int64)


def as4(x):
    """Adds leading size-1 dims to reach rank 4 (how qkv reads rank-2 and rank-3 arguments)."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.ascontiguousarray(x))
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def torch_scores(q, k, *, causal=False, causal_align="top_left", key_lengths=None, query_lengths=None,
                 window=None, keep_mask=None, bias=None, alibi_slopes=None, softcap=None, scale=None):
    """Masked, scaled scores [B, H, N, M] in float64 torch (-inf where a pair is not allowed)."""
    q4 = as4(q).double()
    k4 = as4(k).double()
    B, H, N, D = q4.shape
    M = k4.shape[2]
    k4 = k4.repeat_interleave(H // k4.shape[1], dim=1)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    s = (q4 @ k4.transpose(-1, -2)) * scale
    if softcap:
        softcap = float(np.float32(softcap))  # qkv::Mask stores softcap as float32
        s = softcap * torch.tanh(s / softcap)
    if isinstance(bias, torch.Tensor):
        s = s + as4(bias)
    elif bias is not None:
        s = s + as4(np.asarray(bias, dtype=np.float32)).double()
    mb = _lengths(key_lengths, B, M).view(B, 1, 1, 1)
    nb = _lengths(query_lengths, B, N).view(B, 1, 1, 1)
    i = torch.arange(N).view(1, 1, N, 1)
    j = torch.arange(M).view(1, 1, 1, M)
    diag = i + (mb - nb) if causal_align == "bottom_right" else i + 0 * mb
    if alibi_slopes is not None:
        slopes = torch.tensor(np.asarray(alibi_slopes, dtype=np.float32), dtype=torch.float64).view(1, H, 1, 1)
        s = s - slopes * (j - diag).abs()
    allowed = (j < mb) & (i < nb)
    if causal:
        allowed = allowed & (j <= diag)
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            allowed = allowed & (j >= diag - left)
        if right is not None and right >= 0:
            allowed = allowed & (j <= diag + right)
    if keep_mask is not None:
        allowed = allowed & as4(keep_mask).bool()
    return s.masked_fill(~allowed.expand(B, H, N, M), float("-inf"))


def torch_attention(q, k, v, **mask):
    """(out [B, H, N, Dv], lse [B, H, N]) in float64, with qkv's convention for empty rows.

    q, k, v (and bias) may be torch tensors that require grad; gradients flow through out."""
    s = torch_scores(q, k, **mask)
    v4 = as4(v).double()
    v4 = v4.repeat_interleave(s.shape[1] // v4.shape[1], dim=1)
    # Rows with no allowed key: softmax would be NaN (and its gradient too); qkv gives 0.
    empty = (s == float("-inf")).all(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(empty, torch.zeros_like(s), s), dim=-1)
    p = torch.where(empty, torch.zeros_like(p), p)
    out = p @ v4
    lse = torch.logsumexp(s, dim=-1)
    return out, lse


def assert_close(got, want, tol, what):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64).reshape(got.shape)
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), f"{what}: non-finite entries differ ({seed_note()})"
    assert np.array_equal(got[~finite], want[~finite]), f"{what}: infinite entries differ ({seed_note()})"
    if finite.any():
        err = np.max(np.abs(got[finite] - want[finite]))
        bound = tol * (1.0 + np.max(np.abs(want[finite])))
        assert err <= bound, f"{what}: max |error| {err:.3g} > {bound:.3g}"


SIZES = [1, 3, 17, 64, 65]
DIMS = [1, 3, 40, 59, 64, 111]


def random_case(rng, dtype):
    """A random attention problem with random masks: (q, k, v, mask kwargs, description)."""
    rank = int(rng.integers(2, 5))
    B = int(rng.integers(1, 3)) if rank == 4 else 1
    Hkv = int(rng.integers(1, 3)) if rank >= 3 else 1
    H = Hkv * int(rng.choice([1, 1, 2, 3])) if rank >= 3 else 1
    N, M = int(rng.choice(SIZES)), int(rng.choice(SIZES))
    D, Dv = int(rng.choice(DIMS)), int(rng.choice(DIMS))
    lead = {2: (), 3: (H,), 4: (B, H)}[rank]
    lead_kv = {2: (), 3: (Hkv,), 4: (B, Hkv)}[rank]
    q = rng.standard_normal(lead + (N, D)).astype(dtype)
    k = rng.standard_normal(lead_kv + (M, D)).astype(dtype)
    v = rng.standard_normal(lead_kv + (M, Dv)).astype(dtype)
    mask = {}
    if rng.random() < 0.4:
        mask["causal"] = True
    if rng.random() < 0.5:
        mask["causal_align"] = str(rng.choice(["top_left", "bottom_right"]))
    if rng.random() < 0.3:
        mask["key_lengths"] = [int(x) for x in rng.integers(0, M + 1, size=B)]
    if rng.random() < 0.25:
        mask["query_lengths"] = [int(x) for x in rng.integers(0, N + 1, size=B)]
    if rng.random() < 0.25:
        left = None if rng.random() < 0.3 else int(rng.integers(0, 8))
        right = None if rng.random() < 0.3 else int(rng.integers(0, 8))
        mask["window"] = (left, right)
    if rng.random() < 0.25:
        shape = [(N, M), (1, N, M), lead + (N, M), (N, 1), (1, M)][int(rng.integers(0, 5))]
        mask["keep_mask"] = rng.random(shape) < 0.7
    if rng.random() < 0.25:
        shape = [(N, M), lead + (N, M), (1, M)][int(rng.integers(0, 3))]
        bias = rng.standard_normal(shape).astype(np.float32)
        bias[rng.random(shape) < 0.1] = -np.inf
        mask["bias"] = bias
    if rng.random() < 0.2:
        mask["alibi_slopes"] = [float(x) for x in rng.uniform(0.01, 0.5, size=H)]
    if rng.random() < 0.2:
        mask["softcap"] = float(rng.uniform(1.0, 30.0))
    if rng.random() < 0.2:
        mask["scale"] = float(rng.uniform(0.05, 1.0))
    desc = f"q{q.shape} k{k.shape} v{v.shape} {dtype.__name__} masks={sorted(mask)}"
    return q, k, v, mask, desc
