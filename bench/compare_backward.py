#!/usr/bin/python3
"""The backward section of `make bench`: runs qkv_backward_bench (Google Benchmark, shapes S2-S6,
fp32, 1 and 2 threads, FMA peak per thread group), then times PyTorch 1.13 autograd on the
composite softmax(q @ k^T * scale [+ causal mask]) @ v on the same shapes and thread counts
(torch.set_num_threads), and prints one Markdown table with every ratio taken from this one run.

Usage: compare_backward.py --build <build dir> [--out <dir for raw results>] [--shapes S2,S3]
       [--machine M1.json ...]
PyTorch is timed on the backward alone (torch.autograd.grad of the retained graph for a random
dout), which is what attention_backward computes given the forward's out and lse. Because the
machine may be shared, the ratio to PyTorch comes from qkv and PyTorch calls interleaved in one
process (qkv through its Python module, <build>/python), not from two separate runs. Before each
timed call the process waits until it is idle (see quiesce()), so no idle thread of one library
spins inside the other's timed call.
"""
import argparse
import json
import math
import os
import sys
import time

import lent_rerun
from shapes import load as load_shapes
from torch_threads import set_blas_threads

# name: (B, H, N, D, causal), the shapes this section times
SHAPES = {name: s for name, s in load_shapes().items() if name in ("S2", "S3", "S4", "S5", "S6")}


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def qkv_medians(path):
    """{run_name: (median real time in ms, FLOPS, CPU_FLOPS)} from Google Benchmark's JSON."""
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") == "median":
            name = b["run_name"].split("/repeats:")[0].split("/iterations:")[0].replace("/real_time", "")
            scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
            out[name] = (b["real_time"] * scale, b.get("FLOPS", 0.0), b.get("CPU_FLOPS", 0.0))
    return out


def quiesce(window=0.01, quiet_cpu=0.0005, limit=1.0):
    """Sleeps until the process uses less than `quiet_cpu` seconds of CPU in a `window`.

    PyTorch 1.13 (Debian) runs its sgemm on OpenBLAS's pthread pool, whose idle worker spins on
    sched_yield for 2^28 TSC cycles (~0.1 s here) after each call: on S2 it burnt 36-100% of a
    core for ~0.1 s after every torch.autograd.grad. A qkv call timed right after was charged
    0.4-14 ms of that worker's CPU (more the busier the machine; qkv's own threads used 13 ms)
    and shared the 2 cores with it. Waiting for the spin to end before every timed call (qkv's
    and PyTorch's alike) keeps each library's idle threads out of the other's measurement
    without changing either's settings; both still run under the same load, in one process."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        c0 = time.process_time()
        time.sleep(window)
        if time.process_time() - c0 < quiet_cpu:
            return


def interleaved_ms(shapes, threads_list, build):
    """{"<shape>/threads:<t>": {"qkv": ms, "torch": ms, "qkv_cpu": ms, "torch_cpu": ms}} medians.

    qkv (through its Python module, zero-copy) and PyTorch run alternately on the same inputs, so
    both see the same machine load; *_cpu is the process CPU time per call (all threads), each
    call timed after quiesce()."""
    sys.path.insert(0, os.path.join(os.path.abspath(build), "python"))
    import qkv
    import torch

    torch.manual_seed(0)
    results = {}
    blas = False
    for threads in threads_list:
        torch.set_num_threads(threads)
        blas = set_blas_threads(threads)
        for name in shapes:
            b, h, n, d, causal = SHAPES[name]
            key = f"{name}/threads:{threads}"
            q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
            dout = torch.randn(b, h, n, d)
            qn, kn, vn, dn = (t.detach().numpy() for t in (q, k, v, dout))
            out_q, lse_q = qkv.scaled_dot_product_attention(qn, kn, vn, causal=causal, return_lse=True,
                                                             num_threads=threads)

            def run_qkv():
                qkv.attention_backward(qn, kn, vn, dn, out=out_q, lse=lse_q, causal=causal, num_threads=threads)

            run_torch = None
            try:
                scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
                if causal:
                    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
                out = torch.softmax(scores, dim=-1) @ v
                del scores

                def run_torch():
                    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

                run_torch()  # warm up
            except RuntimeError as e:  # e.g. out of memory for S6's N x N matrices
                print(f"torch {key}: {e}", file=sys.stderr)
                run_torch = None
            run_qkv()
            times = {"qkv": [], "torch": [], "qkv_cpu": [], "torch_cpu": []}
            start = time.perf_counter()
            while len(times["qkv"]) < 3 or (len(times["qkv"]) < 21 and time.perf_counter() - start < 20.0):
                for label, fn in (("qkv", run_qkv), ("torch", run_torch)):
                    if fn is None:
                        continue
                    quiesce()
                    t0, c0 = time.perf_counter(), time.process_time()
                    fn()
                    times[label].append(time.perf_counter() - t0)
                    times[label + "_cpu"].append(time.process_time() - c0)
            results[key] = {k2: (sorted(t)[len(t) // 2] * 1e3 if t else None) for k2, t in times.items()}
            del run_torch
            out = None
    return torch.__version__, results, blas


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--table-only", action="store_true", help="print the table of the results already in --out")
    ap.add_argument("--machine", nargs="*", default=[],
                    help="`qkv bench --machine --json` results: run qkv_backward_bench again while the host lends it "
                         "less than these measured (lent_rerun.py)")
    a = ap.parse_args()
    # As bench/run.sh does (`make bench`), so that running this script alone measures the same:
    # idle OpenMP threads (qkv's and PyTorch's share libgomp's pool) sleep instead of spinning.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    shapes = [s for s in a.shapes.split(",") if s]
    out_dir = a.out or os.path.join(a.build, "bench-results")
    os.makedirs(out_dir, exist_ok=True)
    qkv_json = os.path.join(out_dir, "backward.json")
    torch_json = os.path.join(out_dir, "backward_torch.json")
    if not a.table_only:
        load_before = load()
        print("qkv backward benchmarks...", file=sys.stderr)
        flt = "fma_peak|" + "|".join(f"backward/{s}/" for s in shapes)
        lent_rerun.run([os.path.join(a.build, "bench", "qkv_backward_bench"), f"--benchmark_filter={flt}"], qkv_json,
                       [json.load(open(p)) for p in a.machine])
        print("qkv and PyTorch autograd backward, interleaved...", file=sys.stderr)
        version, pairs, blas = interleaved_ms(shapes, (1, 2), a.build)
        json.dump({"torch": version, "results": pairs, "load_before": load_before, "load_after": load(),
                   "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"), "openblas_threads_set": blas,
                   "quiesced": True}, open(torch_json, "w"))
    saved = json.load(open(torch_json))
    version, pairs = saved["torch"], saved["results"]
    load_before, load_after = saved.get("load_before", "?"), saved.get("load_after", "?")
    policy = saved.get("omp_wait_policy", "?")
    blas = {True: "= thr", False: "no OpenBLAS", None: "default"}[saved.get("openblas_threads_set")]
    quiesced = "idle before each call" if saved.get("quiesced") else "back to back"

    qkv = qkv_medians(qkv_json)
    print(f"Backward. load average (1, 5, 15 min) before: {load_before}; after: {load_after}; torch {version}; "
          f"OMP_WAIT_POLICY={policy}; OpenBLAS threads {blas}; interleaved calls {quiesced}")
    print()
    print("| shape [B·H·N·D] | thr | qkv ms (median) | GFLOP/s | % FMA peak | CPU GFLOP/s | % CPU peak | "
          "interleaved: qkv ms | torch autograd ms | × torch | × torch (CPU time) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for threads in (1, 2):
        peak_ms, peak, peak_cpu = qkv.get(f"fma_peak/threads:{threads}", (0, 0, 0))
        print(f"| FMA peak (12 chains/thread) | {threads} | {peak_ms:.1f} | {peak / 1e9:.1f} | 100 | "
              f"{threads * peak_cpu / 1e9:.1f} | 100 | | | | |")
        for name in shapes:
            key = f"backward/{name}/fp32/threads:{threads}"
            if key not in qkv:
                continue
            ms, fl, fl_cpu = qkv[key]
            b, h, n, d, causal = SHAPES[name]
            label = f"{name} {b}·{h}·{n}·{d}" + (" causal" if causal else "")
            r = pairs.get(f"{name}/threads:{threads}", {})
            pct = 100.0 * fl / peak if peak else 0.0

            def fmt(x):
                return f"{x:.2f}" if x else "n/a"

            ratio = r["torch"] / r["qkv"] if r.get("torch") and r.get("qkv") else None
            cpu_ratio = r["torch_cpu"] / r["qkv_cpu"] if r.get("torch_cpu") and r.get("qkv_cpu") else None
            pct_cpu = 100.0 * fl_cpu / peak_cpu if peak_cpu else 0.0
            print(f"| {label} | {threads} | {ms:.2f} | {fl / 1e9:.1f} | {pct:.0f} | {threads * fl_cpu / 1e9:.1f} | {pct_cpu:.0f} | "
                  f"{fmt(r.get('qkv'))} | "
                  f"{fmt(r.get('torch'))} | {fmt(ratio)} | {fmt(cpu_ratio)} |")
    print()
    print("FLOPs: 10·B·H·N·M·D (half under the causal mask). GFLOP/s and % FMA peak: Google Benchmark medians "
          "(qkv_backward_bench); CPU GFLOP/s: flops / (process CPU seconds / threads), as in the forward's table, which a shared machine's load does not change. × torch: medians of qkv (Python module, given out and lse) and torch.autograd.grad "
          "of the composite's retained graph run alternately in one process, same inputs and thread count.")


if __name__ == "__main__":
    main()
