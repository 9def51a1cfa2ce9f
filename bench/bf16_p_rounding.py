#!/usr/bin/python3
"""Why the bf16 forward keeps P·V in fp32: rounding P to bf16 breaks qkv's bf16 accuracy promise.

qkv promises (tests/fused_bf16_test.cpp) that bf16 attention stays within twice the error that
rounding q, k, v to bf16 causes by itself (plus 2e-5·(1 + max|out|) of fp32 slack). Multiplying
P·V with vdpbf16ps as well would need P in bf16. This script measures, in float64 with only the
roundings in question, how often an *ideal* kernel that rounds P to bf16 (everything else exact)
would break that promise, over random problems shaped like the test's (N, M in {1, 2, 3, 17, 63,
64, 65, 1000}, D in {1, 3, 40, 59, 64, 111, 128, 256}, normal inputs, scale 1/sqrt(D) or random).
Two normalisations: by the sum of the unrounded p (as GPU FlashAttention does) and by the sum of
the rounded p (so the weights sum to 1 exactly). A real kernel only adds fp32 error on top.

Usage: bench/bf16_p_rounding.py [--problems 3000] [--seed S]
"""
import argparse
import sys

import numpy as np

LENGTHS = [1, 2, 3, 17, 63, 64, 65, 1000]
DIMS = [1, 3, 40, 59, 64, 111, 128, 256]


def to_bf16(x):
    """x rounded to the nearest bf16 (ties to even), as float64."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def attention(q, k, v, scale, round_p=None):
    s = q @ k.T * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    if round_p is None:
        return p @ v / p.sum(axis=1, keepdims=True)
    pr = to_bf16(p)
    norm = pr if round_p == "rounded sum" else p
    return pr @ v / norm.sum(axis=1, keepdims=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    modes = ("unrounded sum", "rounded sum")
    broken = dict.fromkeys(modes, 0)
    worst = dict.fromkeys(modes, 0.0)
    done = 0
    while done < args.problems:
        n = int(rng.choice(LENGTHS))
        m = int(rng.choice(LENGTHS)) if rng.integers(3) else n
        d = int(rng.choice(DIMS))
        dv = d if rng.integers(3) == 0 else int(rng.choice(DIMS))
        if n * m * (d + dv) > 2e6:
            continue
        done += 1
        q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((n, d), (m, d), (m, dv)))
        scale = rng.uniform(0.01, 1.0) if rng.integers(4) == 0 else 1 / np.sqrt(d)
        exact = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), scale)
        qr, kr, vr = to_bf16(q), to_bf16(k), to_bf16(v)
        input_error = np.abs(attention(qr, kr, vr, scale) - exact).max()
        bound = 2 * input_error + 2e-5 * (1 + np.abs(exact).max())
        for mode in modes:
            err = np.abs(attention(qr, kr, vr, scale, mode) - exact).max()
            broken[mode] += err > bound
            if input_error > 0:
                worst[mode] = max(worst[mode], err / input_error)
    print(f"seed {seed}, {done} problems; promise: error <= 2x input rounding error + 2e-5(1 + max|out|)")
    for mode in modes:
        print(f"P rounded to bf16, normalised by the {mode}: promise broken in {broken[mode]} problems "
              f"({100.0 * broken[mode] / done:.2f}%), worst error / input rounding error {worst[mode]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
