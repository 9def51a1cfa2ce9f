#!/usr/bin/python3
"""Predicted ring-attention efficiency per ring step: compute vs transfer (docs/ring-attention.md).
`make bench` runs it after the ring benchmark, with the kernel speeds that run measured.

Per step a rank with n = N/P tokens (H heads, head dim D, fp32, K/V heads = H) computes
  forward  4·n²·D·H flops (zigzag causal: half)     and receives K, V:        8·n·D·H bytes
  backward 10·n²·D·H flops (zigzag causal: half)    and receives K, V, dK, dV: 16·n·D·H bytes
With the transfer overlapped, a step takes max(compute, transfer + latency), so
  efficiency = compute / max(compute, transfer + latency)
and compute/transfer = n·W/(2F) forward, 0.625·n·W/F backward (half under a causal mask),
independent of D and H. F = cores per rank × the measured 1-thread kernel speed.

For comparison, DeepSpeed-Ulysses (not built in qkv): all-to-alls turn the sequence shards into
head shards (each rank then holds all N tokens of H/P heads, so P <= H), the attention runs
locally, and an all-to-all brings the output back. Per rank it sends (P-1)/P of four n·D·H
tensors (q, k, v in and out back; backward: dout in, dq, dk, dv back), 16·n·D·H·(P-1)/P bytes,
and the kernel cannot start before its inputs arrive, so
  efficiency = compute / (compute + transfer + latency),  compute = 4·n·N·D·H (10· backward).

    /usr/bin/python3 bench/ring_model.py --fwd 88.8 --bwd 80.3 --cores 32 [--latency-us 20]
"""
import argparse


def efficiency(n, f_flops, w_bytes, latency, backward, causal):
    flops = (10.0 if backward else 4.0) * n * n * (0.5 if causal else 1.0)  # per unit D·H
    bytes_ = (16.0 if backward else 8.0) * n
    compute = flops / f_flops
    return compute / max(compute, bytes_ / w_bytes + latency), compute


def ulysses_efficiency(n, P, f_flops, w_bytes, latency, backward, causal):
    flops = (10.0 if backward else 4.0) * n * n * P * (0.5 if causal else 1.0)  # per unit D·H
    compute = flops / f_flops
    return compute / (compute + 16.0 * n * (P - 1) / P / w_bytes + latency)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fwd", type=float, required=True, help="1-thread forward GFLOP/s (measured)")
    p.add_argument("--bwd", type=float, required=True, help="1-thread backward GFLOP/s (measured)")
    p.add_argument("--cores", type=int, default=32, help="cores per rank")
    p.add_argument("--latency-us", type=float, default=20.0)
    p.add_argument("--D", type=int, default=128)
    a = p.parse_args()
    lat = a.latency_us * 1e-6
    print(f"rank = {a.cores} cores at {a.fwd} (forward) / {a.bwd} (backward) GFLOP/s each; latency {a.latency_us} us/step;"
          f" D = {a.D}, H = 1")
    print("| N | P | N/P | link | fwd | fwd causal | bwd | bwd causal | fwd step ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for N in (1 << 20, 1 << 24):
        for P in (8, 64, 512):
            n = N / P
            for gbit in (25, 100):
                w = gbit / 8 * 1e9
                cells = []
                for backward in (False, True):
                    f = (a.bwd if backward else a.fwd) * 1e9 * a.cores / a.D  # per unit D·H
                    for causal in (False, True):
                        e, _ = efficiency(n, f, w / a.D, lat, backward, causal)
                        cells.append(f"{100 * e:.0f}%")
                step = 4.0 * n * n * a.D / (a.fwd * 1e9 * a.cores) * 1e3
                print(f"| {N >> 20}M | {P} | {int(n)} | {gbit} Gb/s | " + " | ".join(cells) + f" | {step:.2f} |")
    print()
    print("Ring vs Ulysses (forward causal / backward causal; Ulysses needs P <= H):")
    print("| N | P | N/P | link | ring fwd causal | Ulysses fwd causal | ring bwd causal | Ulysses bwd causal |")
    print("|---|---|---|---|---|---|---|---|")
    for N in (1 << 16, 1 << 18, 1 << 20):
        for P in (8, 32, 64):
            n = N / P
            for gbit in (25, 100):
                w = gbit / 8 * 1e9 / a.D
                cells = []
                for backward in (False, True):
                    f = (a.bwd if backward else a.fwd) * 1e9 * a.cores / a.D
                    cells.append(f"{100 * efficiency(n, f, w, lat, backward, True)[0]:.0f}%")
                    cells.append(f"{100 * ulysses_efficiency(n, P, f, w, lat, backward, True):.0f}%")
                print(f"| {N >> 10}k | {P} | {int(n)} | {gbit} Gb/s | " + " | ".join(cells) + " |")
    for gbit in (25, 100):
        w = gbit / 8 * 1e9
        ff, fb = a.fwd * 1e9 * a.cores, a.bwd * 1e9 * a.cores
        print(f"{gbit} Gb/s: transfer-bound below N/P = {2 * ff / w:.0f} tokens (forward), {4 * ff / w:.0f} (causal "
              f"forward), {1.6 * fb / w:.0f} (backward), {3.2 * fb / w:.0f} (causal backward)")


if __name__ == "__main__":
    main()
