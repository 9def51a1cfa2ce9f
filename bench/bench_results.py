"""Reading the results of qkv's Google Benchmark binaries (qkv_bench, qkv_backward_bench) and the
machine probe (`qkv bench --machine --json`): the rules targets.py, compare_backward.py and
lent_rerun.py share.

A binary times its FMA peak at each thread count before that thread count's rows and again after
them. Other load only ever lowers a peak run, so the better of the two is the binary's own peak (a
ceiling), and when the lower of the two reads under LENT of the machine probe's best at the same
thread count, the host lent that binary's threads less than the machine has for part of its rows
(on a 2-vCPU guest, one 2-thread run read half the best peak, and its kernels half their speed with
it; in another, the peak before the rows read 97% and the rows after it ran 4-13 points slow)."""
import json

LENT = 0.9


def aggregates(path, stat):
    """{run_name without the repeats/real_time suffixes: benchmark record} for one aggregate."""
    if not path:
        return {}
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") == stat:
            name = b["run_name"].split("/repeats:")[0].split("/iterations:")[0].replace("/real_time", "")
            out[name] = b
    return out


# The peaks by kind: "fp32" the widest fp32 FMA path, "avx2" the AVX2 FMA path (a binary run with
# --avx2), "bf16" the bf16 products (AMX tiles where granted, else the bf16 dot product). The benchmark binaries' names for their own runs of each,
# before the rows (<name>/threads:<t>) and, for the FMA peaks, after them (<name>/after/threads:<t>):
PEAK_RUNS = {"fp32": "fma_peak", "avx2": "avx2/fma_peak", "bf16": "bf16_peak"}


def peak_runs(maxima, kind, t):
    """The peaks of `kind` a benchmark binary measured itself at t threads, before and after its
    rows where it ran both (each the max aggregate of its repetitions; `maxima` from
    aggregates(path, "max"))."""
    names = (f"{PEAK_RUNS[kind]}/threads:{t}", f"{PEAK_RUNS[kind]}/after/threads:{t}")
    return [maxima[n]["FLOPS"] for n in names if n in maxima]


def own_peak(maxima, kind, t):
    """The best of peak_runs (the binary's ceiling), or None."""
    return max(peak_runs(maxima, kind, t), default=None)


def lent_peak(maxima, kind, t):
    """The lower of peak_runs (what the host lent the binary at its least), or None."""
    return min(peak_runs(maxima, kind, t), default=None)


def machine_peak(machines, kind, t):
    """The best fp32 ("fp32": AVX-512 where the CPU has it, else AVX2) or AVX2 ("avx2") FMA peak the
    machine probe measured at t threads over its invocations, or None where none ran at t threads."""
    runs = [r["fp32_avx512"]["best"] or r["fp32_avx2"]["best"] if kind == "fp32" else r["fp32_avx2"]["best"]
            for m in machines for r in m["threads"] if r["threads"] == t]
    return max(runs) if runs else None
