#!/usr/bin/python3
"""Packed (varlen) against padded attention on one batch of mixed lengths, forward + backward.

    PYTHONPATH=build/python bench/varlen_bench.py [--sequences 32] [--min 16] [--max 2048] [--heads 8]
        [--dim 64] [--threads 0] [--repeats 3] [--seed 1]

The batch: `sequences` lengths drawn uniformly from [min, max] (seeded), causal self-attention,
H heads of dim D. padded: [B, H, Lmax, D] with key_lengths/query_lengths masking the padding
(qkv skips fully masked tiles, but every sequence still pays for its padded rows up to a tile and
the inputs and outputs are Lmax long); packed: qkv.varlen_attention on [total, H, D]. Prints the
median wall time of forward + backward over `repeats`, the bytes of inputs, outputs and gradients
each form holds, and the causal FLOPs actually needed.
"""
import argparse
import statistics
import time

import numpy as np

import qkv


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--sequences", type=int, default=32)
    a.add_argument("--min", type=int, default=16)
    a.add_argument("--max", type=int, default=2048)
    a.add_argument("--heads", type=int, default=8)
    a.add_argument("--dim", type=int, default=64)
    a.add_argument("--threads", type=int, default=0)
    a.add_argument("--repeats", type=int, default=3)
    a.add_argument("--seed", type=int, default=1)
    args = a.parse_args()
    rng = np.random.default_rng(args.seed)
    lens = rng.integers(args.min, args.max + 1, args.sequences)
    H, D, B, L = args.heads, args.dim, args.sequences, int(lens.max())
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    total = int(cu[-1])
    q, k, v, dout = (rng.standard_normal((total, H, D), dtype=np.float32) for _ in range(4))

    def packed():
        out, lse = qkv.varlen_attention(q, k, v, cu, cu, causal=True, return_lse=True, num_threads=args.threads)
        return qkv.varlen_attention_backward(q, k, v, dout, out, lse, cu, cu, causal=True, num_threads=args.threads)

    # The same packed rows stored head-major ([H, total, D] memory seen as [total, H, D]): each head's
    # rows are then adjacent, as in the padded layout, instead of H·D floats apart.
    hq, hk, hv, hd = (np.ascontiguousarray(t.transpose(1, 0, 2)).transpose(1, 0, 2) for t in (q, k, v, dout))

    def head_major():
        out, lse = qkv.varlen_attention(hq, hk, hv, cu, cu, causal=True, return_lse=True, num_threads=args.threads)
        return qkv.varlen_attention_backward(hq, hk, hv, hd, out, lse, cu, cu, causal=True, num_threads=args.threads)

    pq, pk, pv, pd = (np.zeros((B, H, L, D), np.float32) for _ in range(4))
    for s in range(B):
        for src, dst in ((q, pq), (k, pk), (v, pv), (dout, pd)):
            dst[s, :, :lens[s]] = src[cu[s]:cu[s + 1]].transpose(1, 0, 2)
    masks = dict(causal=True, key_lengths=lens.tolist(), query_lengths=lens.tolist())

    def padded():
        out, lse = qkv.scaled_dot_product_attention(pq, pk, pv, return_lse="float64", num_threads=args.threads,
                                                    **masks)
        return qkv.attention_backward(pq, pk, pv, pd, out=out, lse=lse, num_threads=args.threads, **masks)

    def median_seconds(f):
        f()  # warm-up
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    # Both compute the same attention: compare the gradients of the real rows once.
    got, want = packed(), padded()
    err = max(float(np.abs(got[0][cu[s]:cu[s + 1]] - want[0][s, :, :lens[s]].transpose(1, 0, 2)).max())
              for s in range(B))
    t_packed, t_head, t_padded = median_seconds(packed), median_seconds(head_major), median_seconds(padded)
    per_tensor = 4 * H * D  # bytes per row
    # q, k, v, dout, out, dq, dk, dv: eight [rows, H, D] float32 tensors, plus lse (float64).
    mem_packed = 8 * total * per_tensor + 8 * H * total
    mem_padded = 8 * B * L * per_tensor + 8 * B * H * L
    flops = sum(2 * 2 * H * D * n * (n + 1) / 2 for n in lens) * 3.5  # forward (2 products) + backward (~2.5x)
    print(f"varlen vs padded: {B} sequences, lengths {args.min}-{args.max} (total {total}, longest {L}, "
          f"padding {100 * (1 - total / (B * L)):.0f}% of the padded rows), causal, H={H}, D={D}, "
          f"threads={args.threads or qkv.default_num_threads()}, median of {args.repeats}, CPU {qkv.simd_path()}")
    print("| form | fwd+bwd ms | GFLOP/s (causal work) | tensors MB |")
    print("|---|---:|---:|---:|")
    for name, t, mem in (("packed [total, H, D] (varlen)", t_packed, mem_packed),
                         ("packed, stored head-major [H, total, D]", t_head, mem_packed),
                         ("padded [B, H, Lmax, D] + lengths", t_padded, mem_padded)):
        print(f"| {name} | {1e3 * t:.0f} | {flops / t / 1e9:.1f} | {mem / 2**20:.0f} |")
    print(f"padded / packed: time {t_padded / t_packed:.2f}x (head-major: {t_padded / t_head:.2f}x), memory {mem_padded / mem_packed:.2f}x; "
          f"max |dq packed - dq padded| = {err:.1e}")


if __name__ == "__main__":
    main()
