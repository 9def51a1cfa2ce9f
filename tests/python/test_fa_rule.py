"""qkv's fp32 forward and backward held to FlashAttention's own acceptance rule.

FlashAttention's tests accept a kernel when max|x - x_ref| <= 2 * max|x_pt - x_ref| + 1e-5 for
every output x (out, dq, dk, dv): x_ref is attention in high precision (float64 here) on the same
inputs and x_pt is PyTorch's plain composite softmax(q @ k^T * scale) @ v run in the kernel's
precision (fp32 autograd here). Its test matrix scales q by 50 when it tests softcap, so scores
reach ~50-150 (large scores), and uses 9 query heads per kv head (MQA / large GQA groups): both
are drawn here, with and without softcap and the causal mask.

Over 6000 fresh cases (AVX-512, q scaled by 1 to 50) no out, dq or dv
misses the rule (worst 0.47, 0.48, 0.49) and dk misses it in 6 of the ~1000 with q·50 (worst 1.64
with softcap, 1.43 without). With q·k summed in one fp32 chain, dk reached 7x in ~1 case in 700 (and 6.3x on the
scalar path, which rounded each term twice): all of it came from summing q·k in one fp32 chain
over d, which rounds at the size of the vectors where PyTorch's small matmuls sum in 16 lanes.
Scores of large vectors are now summed and scaled again in double, and what their rounding left
goes to the softmax (src/kernels/large_scores.h; docs/accuracy.md).
"""

import math

import numpy as np
import pytest
import torch

import qkv
from py_oracle import as4, random_case, rng_for, seed_note, torch_scores

HEADS = (9, 9, 3, 1)  # kv heads for 9 query heads: MHA, MHA, GQA 3, MQA
LENGTHS = (1, 3, 17, 64, 113, 128, 239)
DIMS = (32, 40, 59, 64, 111, 128)
# Measured worst over 3000 fresh cases (q·1 to q·50): out 0.47, dq 0.37, dk 0.62, dv 0.55
# (docs/accuracy.md).
SLACK = {"out": 1.5, "dq": 1.5, "dk": 1.5, "dv": 1.5}


def composite(q, k, v, dout, causal, softcap, dtype):
    """(out, dq, dk, dv) of softmax(q @ k^T * scale [softcapped, causal]) @ v by torch autograd in
    `dtype`, with k and v repeated over each group of query heads as FlashAttention's reference."""
    qt, kt, vt = (torch.tensor(x, dtype=dtype, requires_grad=True) for x in (q, k, v))
    group = qt.shape[1] // kt.shape[1]
    kr, vr = kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1)
    s = (qt @ kr.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(s, dim=-1) @ vr
    out.backward(torch.tensor(dout, dtype=dtype))
    return [t.detach().double().numpy() for t in (out, qt.grad, kt.grad, vt.grad)]


def draw(rng):
    B = int(rng.integers(1, 3))
    Hkv = int(rng.choice(HEADS))
    N = int(rng.choice(LENGTHS))
    M = N if rng.random() < 0.5 else int(rng.choice(LENGTHS))
    D = int(rng.choice(DIMS))
    causal = bool(rng.random() < 0.5)
    softcap = float(rng.choice([0.0, 50.0]))
    q_mult = 50.0 if softcap or rng.random() < 0.5 else 1.0
    q = (rng.standard_normal((B, 9, N, D)) * q_mult).astype(np.float32)
    k = rng.standard_normal((B, Hkv, M, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, M, D)).astype(np.float32)
    dout = rng.standard_normal((B, 9, N, D)).astype(np.float32)
    desc = f"B={B} H=9 Hkv={Hkv} N={N} M={M} D={D} causal={causal} softcap={softcap} q*{q_mult:g}"
    return q, k, v, dout, causal, softcap, desc


def fa_rule_ratios(q, k, v, dout, causal, softcap, simd="auto", threads=2):
    """{name: max|x - x_ref| / (2 max|x_pt - x_ref| + 1e-5)} for out, dq, dk, dv: <= 1 passes."""
    ref = composite(q, k, v, dout, causal, softcap, torch.float64)
    pt = composite(q, k, v, dout, causal, softcap, torch.float32)
    opts = dict(causal=causal, softcap=softcap or None, num_threads=threads, simd=simd)
    out, lse = qkv.scaled_dot_product_attention(q, k, v, return_lse="float64", **opts)
    grads = qkv.attention_backward(q, k, v, dout, out=out, lse=lse, **opts)
    ratios = {}
    for name, got, want, peer in zip(("out", "dq", "dk", "dv"), [out, *grads], ref, pt):
        err = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
        bound = 2 * float(np.max(np.abs(peer - want))) + 1e-5 if want.size else 1e-5
        ratios[name] = err / bound
    return ratios


def available_paths():
    paths = []
    for simd in ("avx512", "avx2", "scalar"):
        try:
            qkv.simd_path(simd)
            paths.append(simd)
        except ValueError:
            pass
    return paths


@pytest.mark.parametrize("case", range(3000, 3048))
def test_fp32_within_flash_attention_rule(case):
    rng = rng_for(case)
    q, k, v, dout, causal, softcap, desc = draw(rng)
    for simd in available_paths():
        ratios = fa_rule_ratios(q, k, v, dout, causal, softcap, simd=simd)
        bad = {n: round(r, 2) for n, r in ratios.items() if not r <= SLACK[n]}
        assert not bad, f"error / FlashAttention bound > {SLACK}: {bad} ({simd}); {seed_note(case)} {desc}"


# Rows that see a few keys, one of them holding most of the weight, with q scaled by 50: where dk
# sat last (docs/accuracy.md): softcap's logits rounded in fp32, dP − D summed in fp32
# chains, and out's rounding in a dominant key's dS. (kv heads, N, M, D, causal, softcap); 9 query
# heads, B = 2, fresh inputs per case. Held to the rule itself, without the general test's slack:
# before those fixes each of 6 seeds had 1-4 of these 48 cases over 3/4 of it (worst 1.75), most
# runs one over 1. After them the worst of 1,200 fresh cases was 0.70, but the tail is long: one
# case reached 0.754 (QKV_TEST_SEED=1698129422 case=3100, shape 2: dk 1.1e-5 on a value of 32,
# three ulps, where PyTorch's own error was 2.4e-6), and 3/4 failed a clean-clone make test on
# it.
FEW_KEYS_SLACK = 1.0
FEW_KEYS = [
    (1, 1, 3, 59, False, 0.0),
    (3, 1, 3, 128, False, 0.0),
    (9, 1, 3, 59, False, 50.0),
    (1, 3, 3, 40, True, 0.0),
    (3, 3, 3, 128, True, 0.0),
    (1, 3, 17, 40, True, 50.0),
    (9, 3, 17, 40, True, 50.0),
    (3, 17, 17, 64, False, 50.0),
]


@pytest.mark.parametrize("shape", FEW_KEYS)
@pytest.mark.parametrize("case", range(3100, 3110))
def test_fp32_gradients_within_the_rule_on_few_keys_at_q_times_50(shape, case):
    hkv, n, m, d, causal, softcap = shape
    rng = rng_for(case)
    q = (rng.standard_normal((2, 9, n, d)) * 50.0).astype(np.float32)
    k, v = (rng.standard_normal((2, hkv, m, d)).astype(np.float32) for _ in range(2))
    dout = rng.standard_normal((2, 9, n, d)).astype(np.float32)
    for simd in available_paths():
        ratios = fa_rule_ratios(q, k, v, dout, causal, softcap, simd=simd)
        bad = {name: round(r, 2) for name, r in ratios.items() if not r <= FEW_KEYS_SLACK}
        assert not bad, f"error / FlashAttention bound > {FEW_KEYS_SLACK}: {bad} ({simd}); {seed_note(case)} shape {shape}"


def to_bf16(x):
    """(uint16 bfloat16 bits, the same values as float64), rounded to nearest even by torch."""
    t = torch.tensor(x, dtype=torch.float32).bfloat16()
    return t.view(torch.int16).numpy().view(np.uint16), t.double().numpy()


def bf16_composite(q, k, v, mask):
    """PyTorch's softmax(q @ k^T * scale [softcap, + bias, + mask]) @ v with bfloat16 tensors, as
    a user would run it (every op rounds to bf16); fully masked rows give 0."""
    structural = {key: val for key, val in mask.items() if key not in ("softcap", "bias", "scale")}
    additive = torch_scores(np.zeros(q.shape), np.zeros(k.shape), **structural).bfloat16()
    qt, kt, vt = (as4(x).bfloat16() for x in (q, k, v))
    group = qt.shape[1] // kt.shape[1]
    s = (qt @ kt.repeat_interleave(group, dim=1).transpose(-1, -2)) * (mask.get("scale") or 1.0 / math.sqrt(q.shape[-1]))
    if mask.get("softcap"):
        s = mask["softcap"] * torch.tanh(s / mask["softcap"])
    if mask.get("bias") is not None:
        s = s + torch.tensor(np.asarray(mask["bias"], dtype=np.float32)).bfloat16()
    s = s + additive
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(empty, torch.zeros_like(s), s), dim=-1)
    p = torch.where(empty, torch.zeros_like(p), p)
    return (p @ vt.repeat_interleave(group, dim=1)).double().numpy()


@pytest.mark.parametrize("case", range(4000, 4080))
def test_bf16_within_flash_attention_rule(case):
    """bf16 forward: out_ref is float64 attention on the bf16-rounded inputs, out_pt PyTorch's
    bf16 composite on them (FlashAttention's rule for low precision, include/qkv/attention.h)."""
    rng = rng_for(case)
    q, k, v, mask, desc = random_case(rng, np.float32)
    (qb, q64), (kb, k64), (vb, v64) = (to_bf16(x) for x in (q, k, v))
    want = as4(qkv.scaled_dot_product_attention(q64, k64, v64, **mask)).double().numpy()
    peer = bf16_composite(q64, k64, v64, mask)
    bound = 2 * float(np.max(np.abs(peer - want), initial=0.0)) + 1e-5
    for simd in available_paths():
        got = as4(qkv.scaled_dot_product_attention(qb, kb, vb, simd=simd, **mask)).double().numpy()
        err = float(np.max(np.abs(got - want), initial=0.0))
        assert err <= bound, f"bf16 out error {err:.3g} > {bound:.3g} ({simd}); {seed_note(case)} {desc}"


@pytest.mark.parametrize("case", range(5000, 5004))
def test_rows_masked_with_finfo_min_meet_the_rule_through_qkv_torch(case):
    """Hugging Face models mask with torch.finfo(dtype).min added to the scores. A row whose every
    key gets it attends uniformly (its scores are all -3.4e38 in fp32, and in float64 the scores
    are absorbed too), and its lse, -3.4e38 + log(M), cannot hold log(M) even in float64: the
    backward gave such rows' gradients M times too large until it rebuilt their normalizer
    (src/kernels/backward_renorm.h)."""
    import qkv.torch as qt
    rng = rng_for(case)
    B, H, Hkv, N, M, D = 2, 6, 2, int(rng.integers(1, 40)), int(rng.integers(1, 90)), int(rng.choice(DIMS))
    q, k, v = (rng.standard_normal(s) for s in ((B, H, N, D), (B, Hkv, M, D), (B, Hkv, M, D)))
    dout = rng.standard_normal((B, H, N, D))
    mask = np.where(rng.random((B, 1, N, M)) < 0.2, np.finfo(np.float32).min, 0.0)
    mask[:, :, ::3, :] = np.finfo(np.float32).min  # every third row: all keys
    group = H // Hkv

    def grads(fn, dtype):
        x = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in (q, k, v)]
        fn(*x, torch.tensor(mask, dtype=dtype)).backward(torch.tensor(dout, dtype=dtype))
        return [t.grad.double().numpy() for t in x]

    def comp(qt_, kt, vt, m):
        s = qt_ @ kt.repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(D) + m
        return torch.softmax(s, -1) @ vt.repeat_interleave(group, 1)

    ref, pt = grads(comp, torch.float64), grads(comp, torch.float32)
    ours = grads(lambda a, b, c, m: qt.scaled_dot_product_attention(a, b, c, attn_mask=m, enable_gqa=True),
                 torch.float32)
    for name, r, p, o in zip(("dq", "dk", "dv"), ref, pt, ours):
        err, bound = np.abs(o - r).max(), 2 * np.abs(p - r).max() + 1e-5
        assert err <= bound, f"{name}: {err:.3g} above the rule's {bound:.3g} ({seed_note(case)}, N={N} M={M} D={D})"
