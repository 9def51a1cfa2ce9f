#!/usr/bin/python3
"""Runs one of qkv's Google Benchmark binaries (qkv_bench, qkv_backward_bench) again while the host
lends it less than the machine has, and keeps the run it lent the most.

Each run's FMA peak at each thread count it measured, the lower of the two it times before and after
that thread count's rows, is compared with the best the machine probe measured at that thread
count (bench_results.LENT). A run whose peak reads under that fraction is run again, up to --tries
runs in all; the kept run is the one whose lowest such ratio is the highest. Its JSON goes to
--out with two fields added to its context: `lent_runs`, every run's ratios ({threads: lower peak /
machine best}), and `lent_kept`, the index of the kept run, which targets.py reports under its
table. Its console output goes to stdout; what was run again and why goes to stderr. A run with
--avx2 is judged by its AVX2 peak against the probe's AVX2 figure; a binary without FMA peak runs
(a filter without them) runs once.

Usage: lent_rerun.py --machine M1.json [M2.json ...] --out OUT.json [--tries N] -- BINARY [ARGS...]"""
import argparse
import json
import os
import subprocess
import sys

from bench_results import LENT, PEAK_RUNS, aggregates, lent_peak, machine_peak


def ratios(path, machines):
    """{threads: the run's lower FMA peak / the machine probe's best} at each thread count both
    measured: the fp32 peak, or in a run with --avx2 the AVX2 peak against the probe's AVX2 figure."""
    maxima = aggregates(path, "max")
    out = {}
    for kind in ("fp32", "avx2"):
        prefix = f"{PEAK_RUNS[kind]}/threads:"
        for t in {int(name[len(prefix):]) for name in maxima if name.startswith(prefix)}:
            best, own = machine_peak(machines, kind, t), lent_peak(maxima, kind, t)
            if best and own:
                out[t] = min(out.get(t, float("inf")), own / best)
    return out


def run(cmd, out, machines, tries=3):
    """Runs `cmd` (a Google Benchmark binary and its arguments) at most `tries` times as described
    above; writes the kept run's JSON to `out` and returns its console output."""
    runs = []  # (ratios, console output, path) of each finished run
    paths = []  # every run's file, finished or not, removed at the end
    try:
        for i in range(max(tries, 1)):
            path = f"{out}.run{i}"
            paths.append(path)
            r = subprocess.run(cmd + [f"--benchmark_out={path}", "--benchmark_out_format=json"], check=True,
                               stdout=subprocess.PIPE, text=True)
            runs.append((ratios(path, machines), r.stdout, path))
            lent = {t: q for t, q in runs[-1][0].items() if q < LENT}
            if not lent:
                break
            if i + 1 < tries:
                read = ", ".join(f"{100 * q:.0f}% at {t} thread{'s' if t > 1 else ''}" for t, q in sorted(lent.items()))
                print(f"{os.path.basename(cmd[0])}: the host lent run {i + 1} less than the machine: its own FMA peak "
                      f"(the lower of before and after its rows) read {read} of the machine probe's best; running it "
                      "again", file=sys.stderr)
        kept = max(range(len(runs)), key=lambda i: min(runs[i][0].values(), default=1.0))
        result = json.load(open(runs[kept][2]))
        result.setdefault("context", {})["lent_runs"] = [{str(t): q for t, q in sorted(r.items())} for r, _, _ in runs]
        result["context"]["lent_kept"] = kept
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        return runs[kept][1]
    finally:
        for path in paths:
            if os.path.exists(path):
                os.remove(path)


def main():
    ap = argparse.ArgumentParser(usage=__doc__.split("Usage: ")[1])
    ap.add_argument("--machine", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no benchmark binary given after --")
    if a.tries < 1:
        ap.error("--tries must be at least 1")
    machines = [json.load(open(p)) for p in a.machine]
    try:
        sys.stdout.write(run(cmd, a.out, machines, a.tries))
    except OSError as e:
        sys.exit(f"lent_rerun.py: cannot run {cmd[0]}: {e.strerror}")
    except subprocess.CalledProcessError as e:
        sys.exit(f"lent_rerun.py: cannot run {cmd[0]}: it exited with {e.returncode}")


if __name__ == "__main__":
    main()
