"""What the second sum of large scores (src/kernels/large_scores.h) costs as q grows: CPU time of
the forward and of forward + backward, 1·12·1024·64 fp32, 1 thread, q ~ N(0, m²) for m = 1 to 50,
median of 7 calls each; with softcap 50 if SOFTCAP is given.

`make bench` runs it (bench/run.sh); by hand: PYTHONPATH=build/python /usr/bin/python3 bench/large_score_cost.py [SOFTCAP]
"""

import sys
import time

import numpy as np

import qkv

SHAPE = (1, 12, 1024, 64)
MULTS = (1, 2, 4, 8, 50)


def median_ms(call, repeats=7):
    times = []
    for _ in range(repeats):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return sorted(times)[repeats // 2] * 1e3


def main():
    softcap = float(sys.argv[1]) if len(sys.argv) > 1 else None
    rng = np.random.default_rng(7)
    q0, k, v, dout = (rng.standard_normal(SHAPE, dtype=np.float32) for _ in range(4))
    for mult in MULTS:
        q = q0 * np.float32(mult)
        forward = median_ms(lambda: qkv.scaled_dot_product_attention(q, k, v, softcap=softcap, num_threads=1))
        both = median_ms(lambda: qkv.attention_backward(q, k, v, dout, softcap=softcap, num_threads=1))
        print(f"q*{mult:<3} forward {forward:6.1f} ms   forward + backward {both:6.1f} ms", flush=True)


if __name__ == "__main__":
    main()
