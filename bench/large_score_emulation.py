#!/usr/bin/python3
"""Where the fp32 backward's dk error comes from at large scores (ACCURACY.md, "Round 9").

Emulates qkv's fused backward in numpy for one case of tests/python/test_fa_rule.py's `draw`
(without softcap), with the scores S = q·k computed in one of four ways, everything after them
rounded to fp32 as the kernel rounds it (P, dP, D = rowsum(dout ∘ out), dS), and prints
max|dk − dk_ref| / FlashAttention's bound for each, next to qkv's own ratio:

  chain  one fp32 FMA chain over d (the micro-kernel's order, qkv before round 9)
  lanes  16 fp32 chains along d, then a tree (what PyTorch's small matmuls do, to the bit)
  fp32   the exact sum rounded to fp32, then times the fp32 scale and rounded (qkv now)
  exact  the exact scaled score, no rounding at all

Usage (from the build directory): PYTHONPATH=python /usr/bin/python3 ../bench/large_score_emulation.py 300028 101504
Case numbers seed numpy's generator directly (not QKV_TEST_SEED's mix).
"""
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import qkv  # noqa: E402
import test_fa_rule as rule  # noqa: E402

F32, F64 = np.float32, np.float64


def chain(a, b):
    """Σ_d a[..., d]·b[..., d] as one fp32 FMA chain: exact products, one rounding per step."""
    acc = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]), F32)
    for d in range(a.shape[-1]):
        acc = (a[..., d].astype(F64) * b[..., d].astype(F64) + acc.astype(F64)).astype(F32)
    return acc


def lanes(a, b, width=16):
    """16 chains over d = l mod 16, then a pairwise tree."""
    parts = [chain(a[..., s::width], b[..., s::width]) for s in range(min(width, a.shape[-1]))]
    while len(parts) > 1:
        parts = [(parts[i] + parts[i + 1]).astype(F32) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def scores(q, k, how, scale32):
    a, b = q[:, None, :], k[None, :, :]
    if how == "exact":
        return q.astype(F64) @ k.astype(F64).T / math.sqrt(q.shape[-1])
    raw = {"chain": chain, "lanes": lanes}.get(how, lambda x, y: (x.astype(F64) * y.astype(F64)).sum(-1))(a, b)
    return (raw.astype(F32) * scale32).astype(F64)


def emulated_dk(q, k, v, dout, causal, how):
    B, H, N, D = q.shape
    Hkv, M = k.shape[1], k.shape[2]
    group = H // Hkv
    scale32 = F32(1 / math.sqrt(D))
    dk = np.zeros(k.shape)
    for b in range(B):
        for h in range(H):
            Q, K, V, dO = q[b, h], k[b, h // group], v[b, h // group].astype(F64), dout[b, h]
            S = scores(Q, K, how, scale32)
            if causal:
                S = np.where(np.triu(np.ones((N, M), bool), 1), -np.inf, S)
            top = S.max(-1, keepdims=True)
            lse = top + np.log(np.exp(S - top).sum(-1, keepdims=True))  # float64, as the kernel's lse64
            P = np.exp(S - lse).astype(F32).astype(F64)
            out = (P @ V).astype(F32)
            dP = chain(dO[:, None, :], v[b, h // group][None, :, :]).astype(F64)
            row_dot = chain(dO, out).astype(F64)[:, None]
            dS = (P * (dP - row_dot)).astype(F32).astype(F64)
            dk[b, h // group] += dS.T @ Q.astype(F64) * (1 / math.sqrt(D) if how == "exact" else float(scale32))
    return dk


def main():
    for case in [int(c) for c in sys.argv[1:]] or [300028]:
        q, k, v, dout, causal, softcap, desc = rule.draw(np.random.default_rng(case))
        if softcap:
            print(case, desc, "(softcap: not emulated)")
            continue
        ref = rule.composite(q, k, v, dout, causal, softcap, torch.float64)[2]
        peer = rule.composite(q, k, v, dout, causal, softcap, torch.float32)[2]
        bound = 2 * np.abs(peer - ref).max() + 1e-5
        ratios = {"qkv": rule.fa_rule_ratios(q, k, v, dout, causal, softcap, threads=1)["dk"]}
        for how in ("chain", "lanes", "fp32", "exact"):
            ratios[how] = np.abs(emulated_dk(q, k, v, dout, causal, how) - ref).max() / bound
        print(case, desc, " ".join(f"{n} {r:.2f}" for n, r in ratios.items()))


if __name__ == "__main__":
    main()
