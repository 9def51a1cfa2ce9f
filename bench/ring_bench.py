#!/usr/bin/python3
"""Ring attention efficiency: 2 ranks x 1 thread (ring, zigzag) against 1 rank x 2 threads (the
single-process fused kernel), forward and backward, S4 and S6, plain and causal; ratio =
t(single, 2 threads) / t(ring, 2 ranks) per line (1.0 = the ring loses nothing), in wall time and
in CPU time summed over threads or ranks (MPI waits spin, so waiting counts; other jobs' load does
not, which makes the CPU ratio the stable one on a shared machine). Also the
loopback MPI bandwidth and the 1-thread kernel speed that calibrate the model in docs/ring-attention.md.

    /usr/bin/python3 bench/ring_bench.py build/bench/qkv_ring_bench [--reps 3] [--rounds 2]

Each configuration runs `--rounds` times, alternating, and the median over rounds of the
per-run medians is reported, with the load average before and after."""
import argparse
import os
import re
import statistics
import subprocess

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "core"]


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=dict(os.environ, OMP_PROC_BIND="false"))
    return out.stdout


def parse(text):
    rows = {}
    for line in text.splitlines():
        m = re.match(r"(ring|single) (\S+) (\S+) (\S+) .*seconds=([\d.]+) cpu=([\d.]+)", line)
        if m:
            rows[(m[2], m[3], m[4])] = (float(m[5]), float(m[6]))
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("--reps", default="3")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    print("load before:", open("/proc/loadavg").read().strip())
    print(run(MPIRUN + ["-np", "2", a.binary, "bandwidth"]).strip())
    print(run([a.binary, "kernel", "--threads", "1", "--reps", a.reps]).strip())
    single, ring = {}, {}
    for _ in range(a.rounds):
        for key, t in parse(run([a.binary, "single", "--threads", "2", "--reps", a.reps])).items():
            single.setdefault(key, []).append(t)
        for key, t in parse(run(MPIRUN + ["-np", "2", a.binary, "ring", "--threads", "1", "--reps", a.reps])).items():
            ring.setdefault(key, []).append(t)
    print("| shape | mask | pass | 1x2 wall s | 2x1 wall s | wall ratio | 1x2 CPU s | 2x1 CPU s | CPU ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in single:
        sw, sc = (statistics.median(t[i] for t in single[key]) for i in (0, 1))
        rw, rc = (statistics.median(t[i] for t in ring[key]) for i in (0, 1))
        print(f"| {key[0]} | {key[1]} | {key[2]} | {sw:.3f} | {rw:.3f} | {sw / rw:.2f} | {sc:.3f} | {rc:.3f} | "
              f"{sc / rc:.2f} |")
    print("load after:", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
