#!/usr/bin/python3
"""Turns one `make bench` run (Google Benchmark JSON, torch_compare.py JSON, S6 peak memory JSON)
into the forward table kept per machine class in docs/machines/<class>.md. Every ratio in it comes from this one run."""
import argparse
import json
import os

from shapes import load as load_shapes


def microkernels(path, counter="FLOPS"):
    """{name: `counter` per CPU second} of the isolated micro-kernel benchmarks that count it (the
    block products FLOPS, the softmax alone scores)."""
    return {b["run_name"].replace("/repeats:5", ""): b[counter] for b in json.load(open(path))["benchmarks"]
            if b.get("aggregate_name") == "median" and b["run_name"].startswith("microkernel/") and counter in b}


def medians(path, stat="median"):
    """{run_name: (wall ms, wall FLOP/s, process CPU ms per call, threads, flops)}, the `stat` aggregate."""
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") == stat and not b["run_name"].startswith("microkernel/"):
            name = b["run_name"].replace("/repeats:5", "").replace("/real_time", "")
            scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
            out[name] = (b["real_time"] * scale, b.get("FLOPS", 0.0), b["cpu_s_per_iter"] * 1e3,
                         b["cpu_rate_threads"], b["flops_per_iter"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--torch", required=True)
    ap.add_argument("--memory", required=True)
    ap.add_argument("--load-before", default="?")
    ap.add_argument("--load-after", default="?")
    ap.add_argument("--machine", help="`qkv bench --machine --json` output: names the machine's class")
    a = ap.parse_args()
    qkv = medians(a.qkv)
    # The peaks' best repetition: other load only ever lowers a run, and a median peak let a kernel
    # "reach" more than 100% of it.
    for name, record in medians(a.qkv, "max").items():
        if "_peak/" in name:
            qkv[name] = record
    torch = json.load(open(a.torch))["results"]
    mem = json.load(open(a.memory))

    if a.machine:
        m = json.load(open(a.machine))
        print(f"machine: {m['brand']} ({m['vendor']} family {m['family']} model {m['model']}): {m['class']}")
    print(f"load average (1, 5, 15 min) before: {a.load_before}; after: {a.load_after}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    print()
    print("| shape [B·H·N·D] | dtype | thr | qkv ms (median) | GFLOP/s | % FMA peak | CPU GFLOP/s | % CPU peak "
          "| × sdpa | × sdpa CPU | × composite | × composite CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for threads in (1, 2):
        peak_ms, peak, peak_cpu_ms, _, peak_flops = qkv.get(f"fma_peak/threads:{threads}", (0, 0, 0, 1, 0))
        peak_cpu = peak_flops / (peak_cpu_ms / 1e3 / threads) if peak_cpu_ms else 0.0
        print(f"| FMA peak (16 chains/thread, best of 5) | fp32 | {threads} | {peak_ms:.1f} | {peak / 1e9:.1f} | 100 | "
              f"{peak_cpu / 1e9:.1f} | 100 | | | | |")
        for dtype in ("fp32", "bf16"):
            for shape, (b, h, n, d, causal) in load_shapes().items():
                key = f"attention/{shape}/{dtype}/threads:{threads}"
                if key not in qkv:
                    continue
                ms, flops, cpu_ms, _, work = qkv[key]
                cpu_rate = work / (cpu_ms / 1e3 / threads) if cpu_ms else 0.0
                label = f"{shape} {b}·{h}·{n}·{d}" + (" causal" if causal else "")
                ratios = []
                for variant in ("sdpa", "composite"):
                    t = torch.get(f"{shape}/{variant}/threads:{threads}")
                    ratios.append(f"{t[0] / ms:.2f}" if t else "n/a")
                    ratios.append(f"{t[1] / cpu_ms:.2f}" if t and cpu_ms else "n/a")
                time_text = f"{ms * 1e3:.3f} µs" if ms < 0.01 else f"{ms:.3f}"
                pct = 100.0 * flops / peak if peak else 0.0
                cpu_pct = 100.0 * cpu_rate / peak_cpu if peak_cpu else 0.0
                print(f"| {label} | {dtype} | {threads} | {time_text} | {flops / 1e9:.1f} | {pct:.0f} | "
                      f"{cpu_rate / 1e9:.1f} | {cpu_pct:.0f} | {' | '.join(ratios)} |")
    print()
    _, _, peak1_cpu_ms, _, peak1_flops = qkv.get("fma_peak/threads:1", (0, 0, 0, 1, 0))
    peak1 = peak1_flops / (peak1_cpu_ms / 1e3) if peak1_cpu_ms else 0.0
    for name, rate in microkernels(a.qkv).items():
        print(f"{name} (AVX-512, 1 thread, cache-resident 64 x 64 block): {rate / 1e9:.1f} GFLOP/s per CPU second "
              f"= {100 * rate / peak1:.0f}% of the FMA peak" if peak1 else f"{name}: {rate / 1e9:.1f} GFLOP/s")
    for name, rate in microkernels(a.qkv, "scores").items():
        print(f"{name} (the forward block's online softmax alone, no products, 1 thread, in cache): "
              f"{rate / 1e9:.2f} G scores/s per CPU second = {1e9 / rate:.3f} ns per score")
    print()
    print(f"S6 fp32, 2 threads: peak resident memory growth during the call {mem['peak_growth_mb']:.2f} MB "
          f"(inputs + outputs {mem['inputs_outputs_mb']:.1f} MB, VmHWM reset {'ok' if mem['reset_ok'] else 'FAILED'}).")
    print("bf16 rows are compared with PyTorch fp32 on the same shape (1.13 has no fast bf16 CPU attention); their "
          "% FMA peak is of the fp32 FMA peak, as the fp32 rows', where the targets table and `qkv bench` hold them "
          "to the peak of the bf16 products (AMX tiles where granted, else the bf16 dot product).")
    print("CPU columns: flops / (process CPU seconds / threads), for qkv, the FMA peak and PyTorch alike; "
          "they estimate the speed while the threads run, which wall time hides when the machine is loaded.")


if __name__ == "__main__":
    main()
