"""Reading the results of qkv's Google Benchmark binaries (qkv_bench, qkv_backward_bench) and the
machine probe (`qkv bench --machine --json`): the rules targets.py, compare_backward.py and
lent_rerun.py share.

A binary's own peak is the best of its FMA peak runs. Other load only ever lowers a peak run, so
when a binary's own peak reads under LENT of the machine probe's best at the same thread count,
the host lent that binary's threads less than the machine has (on a 2-vCPU guest, one 2-thread run
read half the best peak, and its kernels half their speed with it)."""
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
# --avx2), "bf16" the bf16 dot product. The benchmark binaries' names for their own runs of each:
PEAK_RUNS = {"fp32": "fma_peak", "avx2": "avx2/fma_peak", "bf16": "bf16_peak"}


def own_peak(maxima, kind, t):
    """The peak of `kind` a benchmark binary measured itself at t threads (its runs' max aggregate,
    `maxima` from aggregates(path, "max")), or None."""
    b = maxima.get(f"{PEAK_RUNS[kind]}/threads:{t}")
    return b["FLOPS"] if b else None


def machine_peak(machines, kind, t):
    """The best fp32 ("fp32": AVX-512 where the CPU has it, else AVX2) or AVX2 ("avx2") FMA peak the
    machine probe measured at t threads over its invocations, or None where none ran at t threads."""
    runs = [r["fp32_avx512"]["best"] or r["fp32_avx2"]["best"] if kind == "fp32" else r["fp32_avx2"]["best"]
            for m in machines for r in m["threads"] if r["threads"] == t]
    return max(runs) if runs else None
