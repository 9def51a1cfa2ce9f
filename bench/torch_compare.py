#!/usr/bin/python3
"""Times PyTorch 1.13 CPU attention on the shapes of attention_bench.cpp, for `make bench`.

Two variants, same inputs (normal fp32, [B, H, N, D]), same thread count (torch.set_num_threads,
and OpenBLAS's own thread count, which Debian's torch uses for its sgemm and which
torch.set_num_threads leaves alone):
  sdpa       torch.nn.functional._scaled_dot_product_attention (1.13's fused entry point)
  composite  softmax(q @ k^T * scale [+ causal mask]) @ v
Prints a JSON object {"<shape>/<variant>/threads:<t>": [median wall ms, median process CPU ms],
...}; a variant that fails (e.g. out of memory for S6's N x N matrix) is reported as null.
"""
import json
import math
import sys
import time

import torch

from shapes import load as load_shapes
from torch_threads import set_blas_threads

SHAPES = {name: s for name, s in load_shapes().items() if name in ("S1", "S2", "S3", "S4", "S5", "S6")}


def sdpa(q, k, v, causal):
    return torch.nn.functional._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal)[0]


def composite(q, k, v, causal):
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def median_ms(fn, budget_s=3.0, max_reps=25):
    """Median wall and process-CPU milliseconds of fn()."""
    fn()  # warm up
    walls, cpus = [], []
    start = time.perf_counter()
    while len(walls) < 3 or (len(walls) < max_reps and time.perf_counter() - start < budget_s):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    walls.sort()
    cpus.sort()
    return [walls[len(walls) // 2] * 1e3, cpus[len(cpus) // 2] * 1e3]


def main():
    torch.manual_seed(0)
    results = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        set_blas_threads(threads)
        for name, (b, h, n, d, causal) in SHAPES.items():
            q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
            with torch.no_grad():
                for variant, fn in (("sdpa", sdpa), ("composite", composite)):
                    key = f"{name}/{variant}/threads:{threads}"
                    try:
                        if name == "S1":  # per-call overhead: time a loop of calls
                            reps = 2000
                            ms = [t / reps for t in median_ms(lambda: [fn(q, k, v, causal) for _ in range(reps)])]
                        else:
                            ms = median_ms(lambda: fn(q, k, v, causal))
                        results[key] = ms
                    except RuntimeError as e:
                        print(f"torch {key}: {e}", file=sys.stderr)
                        results[key] = None
    json.dump({"torch": torch.__version__, "results": results}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
