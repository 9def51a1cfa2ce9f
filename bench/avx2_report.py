#!/usr/bin/python3
"""The AVX2 section of `make bench`: the AVX2 path (AttentionOptions::simd =
avx2, as QKV_SIMD=avx2 chooses) on S3 and S4, forward and backward, 1 and 2 threads, each as a
percentage of the AVX2 FMA peak measured by the same binary in the same run (`qkv_bench --avx2`,
`qkv_backward_bench --avx2`), plus the AVX2 micro-kernel alone. Target: >= 80% for N >= 1024.

Usage: avx2_report.py --forward <json> --backward <json> [--load-before ..] [--load-after ..]"""
import argparse
import json

SHAPES = {"S3": "1·12·1024·64", "S4": "1·8·4096·64"}
TARGET = 80.0


def medians(path):
    """{name: (median wall ms, wall FLOP/s, FLOP/s per CPU second per thread)} of one JSON file.

    The forward binary reports process CPU seconds per iteration (cpu_s_per_iter), the backward
    one flops per process CPU second (CPU_FLOPS); both become flops / (CPU seconds / threads)."""
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"].split("/repeats:")[0].split("/iterations:")[0].replace("/real_time", "")
        scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
        threads = int(name.rsplit("threads:", 1)[1]) if "threads:" in name else 1
        if "CPU_FLOPS" in b:
            cpu_rate = b["CPU_FLOPS"] * threads
        elif "cpu_s_per_iter" in b:
            cpu_rate = b["flops_per_iter"] / (b["cpu_s_per_iter"] / threads)
        else:  # micro-kernels: Google Benchmark's own CPU time of the one thread
            cpu_rate = b.get("FLOPS", 0.0)
        out[name] = (b["real_time"] * scale, b.get("FLOPS", 0.0), cpu_rate)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forward", required=True)
    ap.add_argument("--backward", required=True)
    ap.add_argument("--load-before", default="?")
    ap.add_argument("--load-after", default="?")
    a = ap.parse_args()
    runs = {"forward": medians(a.forward), "backward": medians(a.backward)}
    print(f"AVX2 path (QKV_SIMD=avx2). load average (1, 5, 15 min) before: {a.load_before}; "
          f"after: {a.load_after}")
    print()
    print("| pass | shape [B·H·N·D] | thr | ms (median) | GFLOP/s | % AVX2 peak | CPU GFLOP/s | % AVX2 CPU peak | ≥ 80% |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, qkv in runs.items():
        for threads in (1, 2):
            peak_ms, peak, peak_cpu = qkv.get(f"avx2/fma_peak/threads:{threads}", (0, 0, 0))
            print(f"| {kind} | AVX2 FMA peak (12 chains/thread) | {threads} | {peak_ms:.1f} | {peak / 1e9:.1f} | 100 | "
                  f"{peak_cpu / 1e9:.1f} | 100 | |")
            for shape, dims in SHAPES.items():
                key = f"avx2/{'attention' if kind == 'forward' else 'backward'}/{shape}/fp32/threads:{threads}"
                if key not in qkv:
                    continue
                ms, rate, cpu_rate = qkv[key]
                pct = 100 * rate / peak if peak else 0.0
                cpu_pct = 100 * cpu_rate / peak_cpu if peak_cpu else 0.0
                met = "yes" if cpu_pct >= TARGET else "no"
                print(f"| {kind} | {shape} {dims} | {threads} | {ms:.2f} | {rate / 1e9:.1f} | {pct:.0f} | "
                      f"{cpu_rate / 1e9:.1f} | {cpu_pct:.0f} | {met} |")
    print()
    fwd = runs["forward"]
    peak1 = fwd.get("avx2/fma_peak/threads:1", (0, 0, 0))[2]
    for name, (_, _, rate) in sorted(fwd.items()):
        if name.startswith("avx2/microkernel/") and peak1 and rate:  # the softmax alone counts no flops
            print(f"- {name} (1 thread, cache-resident 64 x 64 block): {rate / 1e9:.1f} GFLOP/s per CPU second "
                  f"= {100 * rate / peak1:.0f}% of the AVX2 FMA peak")
    print("- % AVX2 peak: wall medians; CPU columns: flops / (process CPU seconds / threads), judged against the "
          "target since a shared machine's load does not lower them. FLOPs: 4·B·H·N²·D forward, 10·B·H·N²·D "
          "backward.")


if __name__ == "__main__":
    main()
