"""FlashAttention's rule over fresh cases with q scaled by 1 to 50, around the limit where
src/kernels/large_scores.h sums scores again in double: the worst error / rule per scaling (and
softcap) for out, dq, dk, dv, and how many cases went over 1.

Usage, in build/: PYTHONPATH=python:../tests/python /usr/bin/python3 ../bench/fa_rule_tail.py CASES SEED
"""

import collections
import sys

import numpy as np

import test_fa_rule as fa

MULTS = (1.0, 2.0, 4.0, 8.0, 16.0, 50.0)


def main():
    cases, seed = int(sys.argv[1]), int(sys.argv[2])
    rng = np.random.default_rng(seed)
    worst = collections.defaultdict(lambda: dict.fromkeys(("out", "dq", "dk", "dv"), 0.0))
    over = collections.Counter()
    for _ in range(cases):
        q, k, v, dout, causal, softcap, desc = fa.draw(rng)
        mult = float(rng.choice(MULTS))
        q = (q / (50.0 if "q*50" in desc else 1.0) * mult).astype(np.float32)  # draw's own q, rescaled
        key = f"q*{mult:g}{' softcap' if softcap else ''}"
        for name, ratio in fa.fa_rule_ratios(q, k, v, dout, causal, softcap, threads=1).items():
            worst[key][name] = max(worst[key][name], ratio)
            over[key, name] += ratio > 1
    for key in sorted(worst, key=lambda s: (float(s[2:].split()[0]), s)):
        print(f"{key:12s} " + " ".join(f"{n} {w:.2f} ({over[key, n]} over)" for n, w in worst[key].items()))


if __name__ == "__main__":
    main()
