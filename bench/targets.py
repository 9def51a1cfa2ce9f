#!/usr/bin/python3
"""The head and the targets table of `make bench`: the machine (class, L3, eviction, peaks,
bandwidth, the spread of the bandwidth probe over several invocations and an outside plain read
beside it), then every row of the performance targets as a % of the ceilings measured on this
machine in this run, each with its target and whether it is met.

Ceilings: at each thread count the fp32 and bf16 peaks are the best of every measurement this run
made (`qkv bench --machine` invocations and the benchmarks' own peak runs): other load only ever
lowers a peak run, so the best is the closest to the machine's, and no kernel can then "reach"
more than 100% of it. The read bandwidth is the median, over the invocations, of each one's best
sustained figure (a median of passes).

The plain read runs right after each invocation of the probe and takes the same statistic (the
best median of 1, 2, 4 and 8 streams per thread); it also calls the probe between its own passes
and compares the two round by round (probe_vs_plain_pct), so a machine whose bandwidth drifts
between minutes, or between seconds, moves both sides of each pair alike. Older results without
that field are compared invocation by invocation. Likewise the decode rows that compare two layouts or storage types take
decode_bench's paired steps (vs_partner_pct), and the decode rows against the read bandwidth take
each step beside a plain read of as many bytes (read_pct, read_GBps), where it measured them;
older results fall back to the benchmarks' medians and the probe's bandwidth. Given more than one
decode file (qkv_decode_bench run in separate processes), each decode number is the median over the
processes that ran its benchmark.

Where bench/lent_rerun.py ran a binary again because the host lent it less than the machine (the
lower of its own FMA peaks, timed before and after its rows, under the probe's best), a line under
the table says so and which run the table takes.

Last, where the run pinned one thread to each CPU in turn (--pinned CPU forward.json backward.json,
once per CPU), the one-thread kernel rows again per CPU, each against the peaks that CPU's own run
measured, beside the blocks alone where that run timed them: on a shared host one vCPU can run the
same kernel markedly slower than another in the same minutes, which an unpinned row only shows as
noise. Their verdict is the best CPU's.

A decode step's floor is its bytes at the read bandwidth or its FMAs at the FMA peak, whichever
takes longer, times how far this core overlaps a stream with the FMAs that consume it at the step's
FMAs per byte (--overlap: `qkv_decode_floor_probe --overlap`, a plain loop reading 1 GiB per
thread; given several runs, the best overlap any of them reached; 1 where it did not run, i.e. a
full overlap).

`targets.py --decode-filter` prints the filter of the cold decode steps the targets take
(bench/run.sh runs them in more processes).

Usage: targets.py --machine M1.json [M2.json ...] [--plain P1.json [P2.json ...]] [--qkv qkv.json]
       [--backward backward.json] [--decode decode.json [decode-2.json ...]] [--avx2 avx2.json avx2_backward.json]
       [--pinned CPU FWD.json BWD.json ...] [--overlap O1.json [O2.json ...]]"""
import argparse
import json
import statistics

import shapes
from bench_results import LENT, aggregates, lent_peak, machine_peak, own_peak

# The lengths of the D1 steps the decode rows take, cold, contiguous and (at the longest) in the
# default pages; with D8's steps in the default pages, the steps bench/run.sh runs in more processes.
D1_LENGTHS = (16384, 32768)


def decode_filter():
    """Google Benchmark's filter for every cold decode step the targets take."""
    return f"^decode/(D1/[^/]+/M:({'|'.join(map(str, D1_LENGTHS))})(/paged[0-9]+)?|D8/[^/]+/paged[0-9]+)/cold/"


def context(path):
    return json.load(open(path)).get("context", {}) if path else {}


def seconds(b):
    return b["real_time"] * {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]


def percent_of(table, name, t, ceiling):
    """Benchmark `name` of `table` as a % of ceiling[t], or None where either is missing."""
    b = table.get(name)
    return 100 * b["FLOPS"] / ceiling[t] if b and ceiling.get(t) else None


def block_percents(table, benches, peak, prefix=""):
    """The blocks alone that a kernel row's benchmarks name (their fourth field) and `table` timed,
    as a % of the one-thread `peak` (microkernel_block.h: one cache-resident block of the row's head
    dim, its products and what the kernel does between them, on one thread): what the row's kernel
    reaches with no packing, masks or memory traffic around its blocks. Not the machine's ceiling
    but the design's. prefix: "avx2/" for the blocks of a --avx2 run."""
    values = [percent_of(table, prefix + block, 1, {1: peak}) for *_, block in benches if block]
    return [v for v in values if v is not None]


def decode_medians(paths):
    """{name: median record} of qkv_decode_bench's results over one or more processes: where several
    processes ran a benchmark, each of its numbers is the median over them, and `processes` says how
    many (a process draws how its caches are placed, and its steps keep that all its life)."""
    runs = [aggregates(p, "median") for p in paths]
    out = {}
    for name in dict.fromkeys(n for r in runs for n in r):
        records = [r[name] for r in runs if name in r]
        merged = dict(records[0], processes=len(records))
        for key, v in records[0].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and all(key in r for r in records):
                merged[key] = statistics.median(r[key] for r in records)
        out[name] = merged
    return out


def rng(values, fmt="{:.0f}"):
    values = [v for v in values if v is not None]
    if not values:
        return "not measured"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def verdict(values, ok):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    met = [ok(v) for v in values]
    return "met" if all(met) else ("partly" if any(met) else "not met")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--machine", nargs="+")
    ap.add_argument("--decode-filter", action="store_true", help="print decode_filter() and stop")
    ap.add_argument("--plain", nargs="+", default=[])
    ap.add_argument("--qkv")
    ap.add_argument("--backward")
    ap.add_argument("--decode", nargs="+", default=[])
    ap.add_argument("--avx2", nargs=2)
    ap.add_argument("--pinned", nargs=3, action="append", default=[], metavar=("CPU", "FWD", "BWD"))
    ap.add_argument("--overlap", nargs="+", default=[])
    a = ap.parse_args()
    if a.decode_filter:
        print(decode_filter())
        return
    if not a.machine:
        ap.error("the following arguments are required: --machine")
    machines = [json.load(open(p)) for p in a.machine]
    m = machines[0]
    fwd, fwd_max = aggregates(a.qkv, "median"), aggregates(a.qkv, "max")
    bwd, bwd_max = aggregates(a.backward, "median"), aggregates(a.backward, "max")
    dec, dec_ctx = decode_medians(a.decode), context(a.decode[0] if a.decode else None)
    overlap = {}  # threads -> bits -> the lowest factor over the runs
    for o in (json.load(open(p))["overlap"] for p in a.overlap):
        for t, by_bits in o.items():
            for bits, f in by_bits.items():
                overlap.setdefault(t, {})[bits] = min(f["factor"], overlap.get(t, {}).get(bits, float("inf")))

    # Ceilings per thread count, and the plain read beside the probe: (its median, the median of
    # probe / plain - 1 in %).
    plains = [json.load(open(p)) for p in a.plain]
    peak, bf16, bw, bw_runs, spread, plain = {}, {}, {}, {}, {}, {}
    bf16_dot = "bf16 dot"  # what the bf16 rows' ceiling is called; None: bf16 runs on fp32 FMAs
    for t in (1, 2):
        rows = [r for mm in machines for r in mm["threads"] if r["threads"] == t]
        if not rows:
            continue
        own = [p for p in (own_peak(fwd_max, "fp32", t), own_peak(bwd_max, "fp32", t)) if p]
        peak[t] = max([machine_peak(machines, "fp32", t)] + own)
        # The bf16 ceiling is the peak of what the bf16 forward's products run on: AMX tiles where
        # the probe measured them (the OS granted AMX), else vdpbf16ps. A CPU with neither widens
        # bf16 inputs and runs fp32 FMAs: its bf16 ceiling is the fp32 peak.
        amx = [r["bf16_amx"]["best"] for r in rows if r.get("bf16_amx", {}).get("best")]
        bf16_runs = amx or [r["bf16_dot"]["best"] for r in rows if r["bf16_dot"]["best"]]
        bf16_runs += [p for p in (own_peak(fwd_max, "bf16", t),) if p]
        bf16[t] = max(bf16_runs) if bf16_runs else peak[t]
        bf16_dot = ("bf16 AMX tile" if amx else "bf16 dot") if bf16_runs else None
        bw_runs[t] = [r["bandwidth"]["best"] for r in rows]
        bw[t] = statistics.median(bw_runs[t])
        spread[t] = (max(bw_runs[t]) - min(bw_runs[t])) / bw[t] * 100
        # The plain read calls the probe between its own passes and compares the two round by round
        # (probe_vs_plain_pct); older results: invocation i's probe figure against the plain read
        # run right after it. (its median, the comparison, how it was paired)
        rounds = [pl[f"probe_vs_plain_pct_{t}"] for pl in plains if f"probe_vs_plain_pct_{t}" in pl]
        pairs = [(probe, pl[f"threads_{t}"]) for probe, pl in zip(bw_runs[t], plains) if pl.get(f"threads_{t}")]
        if rounds:
            plain[t] = (statistics.median(pl[f"threads_{t}"] for pl in plains), statistics.median(rounds),
                        "the probe against it round by round in one process, median over rounds and runs")
        elif pairs:
            plain[t] = (statistics.median(p for _, p in pairs),
                        100 * (statistics.median(probe / p for probe, p in pairs) - 1),
                        "each right after an invocation; the probe against it, pair by pair")

    simd = f"; the kernels' {m['simd']} path" if "simd" in m else ""  # older results lack it
    print(f"machine: {m['brand']} ({m['vendor']} family {m['family']} model {m['model']}): **{m['class']}**{simd}")
    print(f"L3 {m['l3_bytes'] >> 20} MiB ({m['l3_source']}); cold-cache eviction {m['eviction_bytes'] >> 20} MiB")
    for t in sorted(peak):
        r = [r for r in m["threads"] if r["threads"] == t][0]
        streams = ", ".join(f"{s['streams']}: {s['median'] / 1e9:.1f}" for s in r["bandwidth"]["by_streams"])
        bf16_text = f"{bf16_dot} peak {bf16[t] / 1e9:.1f} GFLOP/s" if bf16_dot else "no bf16 dot product (bf16 runs on fp32 FMAs)"
        line = (f"{t} thread{'s' if t > 1 else ''}: fp32 FMA peak {peak[t] / 1e9:.1f} GFLOP/s, {bf16_text}; read bandwidth {bw[t] / 1e9:.1f} GB/s (median of {len(bw_runs[t])} "
                f"invocations, spread {spread[t]:.1f}%; first invocation by streams per thread {streams})")
        if t in plain:
            p, diff, how = plain[t]
            line += (f"; a plain read {p / 1e9:.1f} GB/s (its best of 1-8 streams per thread, median of {len(plains)} "
                     f"runs; {how}: {diff:+.1f}%)")
        print(line)
    if overlap:
        runs = "one run" if len(a.overlap) == 1 else f"the best of {len(a.overlap)} runs"
        per_t = []
        for t, by_bits in overlap.items():
            factors = ", ".join(f"{by_bits[bits]:.2f}" for bits in ("32", "16", "8"))
            per_t.append(f"{factors} at {t} thread{'s' if t != '1' else ''}")
        print("decode floors' overlap (a stream consumed by FMAs at decode's FMAs per byte, for 32-, 16- and "
              f"8-bit rows; qkv_decode_floor_probe --overlap, {runs}): the longer of the "
              "two times " + "; ".join(per_t))
    beside = {t: [b["read_GBps"] for n, b in dec.items() if "read_GBps" in b and n.endswith(f"/cold/threads:{t}")]
              for t in (1, 2)}
    if any(beside.values()):
        print("decode rows against the read bandwidth: each cold step beside a plain read of as many bytes, "
              "pair by pair; those reads' medians " +
              ", ".join(f"{rng(v, '{:.1f}')} GB/s at {t} thread{'s' if t > 1 else ''}" for t, v in beside.items() if v))
    repeated = sorted({b["processes"] for b in dec.values() if b["processes"] > 1})
    if repeated:
        print(f"decode rows: each benchmark qkv_decode_bench ran in more than one process ({rng(repeated)} processes) "
              "is the median over them (a process draws how its caches are placed, and its steps keep that)")
    print()

    print(f"| work ({m['class']}) | thr | measured | target | |")
    print("|---|---|---|---|---|")

    # ceiling: the highest value the roofline allows each of `values` (same order), printed beside
    # the measured range, so a miss that the machine itself imposes shows as such; ceiling_is names
    # what it is where that is not the roofline's bound on the measured value itself.
    def row(work, t, values, target, ok, fmt="{:.0f}", unit="%", ceiling=None, note="", ceiling_is="ceiling"):
        shown = any(v is not None for v in values)
        cap = (f" ({ceiling_is} {rng(ceiling, fmt)}{unit})" if ceiling and any(c is not None for c in ceiling)
               else "")
        print(f"| {work} | {t} | {rng(values, fmt)}{unit if shown else ''}{cap}{note} | {target} | {verdict(values, ok)} |")

    def dec_bw(b, t):  # the read bandwidth a cold step is judged by: the read beside it, else the probe's
        return b["read_GBps"] * 1e9 if "read_GBps" in b else bw.get(t)

    def dec_pct(name, t):  # % of the read bandwidth: bytes per step / bandwidth, pair by pair when paired
        b = dec.get(f"decode/{name}/cold/threads:{t}")
        if not b:
            return None
        if "read_pct" in b:
            return b["read_pct"]
        return 100 * b["GBps"] * 1e9 / bw[t] if t in bw else None

    def dec_time(name, t):
        b = dec.get(f"decode/{name}/cold/threads:{t}")
        return seconds(b) if b else None

    def dec_paired(name, t):  # % by which name's steps outlast their partner's, each pair side by side
        b = dec.get(f"decode/{name}/cold/threads:{t}")
        return b.get("vs_partner_pct") if b else None

    # A decode step's floor: its bytes at the read bandwidth or its FMAs at the FMA peak, whichever
    # takes longer (the int8 and 16-bit steps can be bound by their arithmetic on a core with fast
    # memory and 256-bit FMAs), times the overlap this core reached between the two at the step's
    # FMAs per byte (never below 1: the longer of the two is the bound whatever the probe read).
    # judged_by: the benchmark whose bandwidth to use instead of name's own, so that two floors
    # compared with each other divide by the same bandwidth.
    def dec_floor(name, t, judged_by=None):
        b = dec.get(f"decode/{name}/cold/threads:{t}")
        j = dec.get(f"decode/{judged_by or name}/cold/threads:{t}")
        if not b or not j or "step_bytes" not in b or not dec_bw(j, t) or t not in peak:
            return None
        bits = {"f32": "32", "bf16": "16", "f16": "16", "i8": "8"}[name.split("/")[1]]
        factor = overlap.get(str(t), {}).get(bits, 1.0)
        return max(b["step_bytes"] / dec_bw(j, t), b["step_flops"] / peak[t]) * max(1.0, factor)

    def dec_pct_ceiling(name, t):  # the highest % of the read bandwidth the floor allows
        b, floor = dec.get(f"decode/{name}/cold/threads:{t}"), dec_floor(name, t)
        return 100 * b["step_bytes"] / dec_bw(b, t) / floor if floor else None

    for t, goal in ((1, 75), (2, 85)):
        names = [f"D1/{d}/M:{M}" for d in ("f32", "bf16", "f16") for M in D1_LENGTHS]
        row("decode D1, M ≥ 16k, f32/f16/bf16, % of read bandwidth", t, [dec_pct(n, t) for n in names],
            f"≥ {goal}%", lambda v: v >= goal, ceiling=[dec_pct_ceiling(n, t) for n in names])
    for t in (1, 2):
        vals, caps = [], []
        for M in D1_LENGTHS:
            # Older results, without the pairs: the two benchmarks' medians.
            pct = dec_paired(f"D1/i8/M:{M}", t)
            if pct is not None:
                vals.append(1 / (1 + pct / 100))
            else:
                f16, i8 = dec_time(f"D1/f16/M:{M}", t), dec_time(f"D1/i8/M:{M}", t)
                vals.append(f16 / i8 if f16 and i8 else None)
            # int8's steps run beside f16's (vs_partner_pct), so both floors take f16's bandwidth.
            f16, i8 = dec_floor(f"D1/f16/M:{M}", t), dec_floor(f"D1/i8/M:{M}", t, judged_by=f"D1/f16/M:{M}")
            caps.append(f16 / i8 if f16 and i8 else None)
        # A ratio of two steps: with f16 slower than its floor the measured ratio can pass the ratio
        # of the floors (it did: 1.42-1.48× against 1.33-1.42×), so the bound is named for what it is.
        row("decode int8: f16's step time / int8's, M ≥ 16k", t, vals, "≥ 1.6×", lambda v: v >= 1.6, "{:.2f}", "×",
            ceiling=caps, ceiling_is="with both steps at their floors")
    page = dec_ctx.get("default_page_tokens", "?")
    M = D1_LENGTHS[-1]  # the pages row's length
    for t in (1, 2):
        vals = []
        for d in ("f32", "bf16", "f16", "i8"):
            pct = dec_paired(f"D1/{d}/M:{M}/paged{page}", t)
            if pct is None:  # older results: the two benchmarks' medians, taken seconds or minutes apart
                p, c = dec_time(f"D1/{d}/M:{M}/paged{page}", t), dec_time(f"D1/{d}/M:{M}", t)
                pct = 100 * (p / c - 1) if p and c else None
            vals.append(pct)
        row(f"decode in default pages ({page} tokens) vs contiguous, M = {M // 1024}k, time", t, vals, "≤ +5%",
            lambda v: v <= 5, "{:+.0f}")
    for t in (1, 2):
        names = [f"D8/{d}/paged{page}" for d in ("f32", "f16")]
        row("batched decode D8 (8 × 4096), f32/f16, % of bandwidth", t, [dec_pct(n, t) for n in names], "≥ 85%",
            lambda v: v >= 85, ceiling=[dec_pct_ceiling(n, t) for n in names])
        row("batched decode D8, int8, % of bandwidth", t, [dec_pct(f"D8/i8/paged{page}", t)], "≥ 85%",
            lambda v: v >= 85, ceiling=[dec_pct_ceiling(f"D8/i8/paged{page}", t)])

    # The kernel rows against the FMA (or bf16 dot) peak, in groups printed thread count by thread
    # count: (work, target, test, [(table, benchmark name with {t} for the thread count, which
    # peak, the block benchmark of its head dim or None)]). The pinned table takes them again.
    head_dim = {name: d for name, (_, _, _, d, _) in shapes.load().items()}

    kernel_rows = [
        [("prefill fp32 S3/S4/S6 (N ≥ 1024), % of FMA peak", "≥ 85%", lambda v: v >= 85,
          [("fwd", f"attention/{s}/fp32/threads:{{t}}", "fp32", f"microkernel/fused_D{head_dim[s]}")
           for s in ("S3", "S4", "S6")])],
        [(f"prefill bf16 S3/S4, % of {bf16_dot or 'fp32 FMA'} peak", "≥ 80%", lambda v: v >= 80,
          [("fwd", f"attention/{s}/bf16/threads:{{t}}", "bf16", None) for s in ("S3", "S4")])],
        [("backward fp32 S3/S4/S6, % of FMA peak", "≥ 85%", lambda v: v >= 85,
          [("bwd", f"backward/{s}/fp32/threads:{{t}}", "fp32", f"microkernel/backward_D{head_dim[s]}")
           for s in ("S3", "S4", "S6")])],
        [("short heads S2 forward", "≥ 80%", lambda v: v >= 80,
          [("fwd", "attention/S2/fp32/threads:{t}", "fp32", "microkernel/fused_D64")]),
         ("short heads S2 backward", "≥ 75%", lambda v: v >= 75,
          [("bwd", "backward/S2/fp32/threads:{t}", "fp32", "microkernel/backward_D64")])],
        [("large scores S3q50, % of FMA peak", "≥ 70%", lambda v: v >= 70,
          [("fwd", "attention/S3q50/fp32/threads:{t}", "fp32", "microkernel/fused_D64")])],
    ]
    # The peak each benchmark binary measured itself before and after its rows, minutes from the
    # run's best: where the host lent a binary's threads less than that (one 2-thread backward run
    # read half the best peak beside its kernels, on a 2-vCPU guest), the row also says what it
    # reached against the lower of the two.
    tables = {"fwd": (fwd, fwd_max), "bwd": (bwd, bwd_max)}
    ceilings = {"fp32": peak, "bf16": bf16}

    def lent(benches, t):
        own = []
        for tb, name, pk, _ in benches:
            p, best = lent_peak(tables[tb][1], pk, t), ceilings[pk].get(t)
            reached = percent_of(tables[tb][0], name.format(t=t), t, {t: p})
            if reached is not None and best and p < LENT * best:
                own.append((reached, 100 * p / best))
        if not own:
            return ""
        return (f"; {rng([o for o, _ in own])}% of the lower peak its binary measured before and after its rows, "
                f"which read {rng([q for _, q in own])}% of the run's best")

    # Each row's blocks alone (block_percents), beside it at either thread count: those of the path
    # the rows ran, qkv_bench's own (AVX-512) or, where the kernels run AVX2 (a CPU without
    # AVX-512), those of its --avx2 run.
    blocks, prefix = fwd, ""
    if m.get("simd") == "avx2" and a.avx2:
        blocks, prefix = aggregates(a.avx2[0], "median"), "avx2/"

    for group in kernel_rows:
        for t in (1, 2):
            for work, target, ok, benches in group:
                row(work, t, [percent_of(tables[tb][0], name.format(t=t), t, ceilings[pk])
                              for tb, name, pk, _ in benches],
                    target, ok, note=lent(benches, t), ceiling=block_percents(blocks, benches, peak.get(1), prefix),
                    ceiling_is="the block alone")
    # The roofline itself.
    for t in sorted(bw):
        row(f"roofline: bandwidth spread over {len(bw_runs[t])} invocations", t, [spread[t]], "≤ 10%", lambda v: v <= 10,
            "{:.1f}")
        if t in plain:
            row("roofline: probe vs a plain multi-stream read (paired)", t, [plain[t][1]], "within ±5%",
                lambda v: abs(v) <= 5, "{:+.1f}")
    # No kernel above its ceiling: every fp32 and bf16 forward/backward row, and the AVX2 rows
    # against the AVX2 peak of the same run.
    highest = []
    for t in sorted(peak):
        for name, b in list(fwd.items()) + list(bwd.items()):
            if name.endswith(f"/threads:{t}") and ("/attention/" in "/" + name or "/backward/" in "/" + name):
                ceiling = bf16 if "/bf16/" in name else peak
                highest.append(100 * b["FLOPS"] / ceiling[t])
    if a.avx2:
        for path in a.avx2:
            med, mx = aggregates(path, "median"), aggregates(path, "max")
            for t in (1, 2):
                peaks = [p for p in (own_peak(mx, "avx2", t) or own_peak(med, "avx2", t),
                                     machine_peak(machines, "avx2", t)) if p]
                avx2_peak = max(peaks) if peaks else None
                for name, b in med.items():
                    if name.endswith(f"/threads:{t}") and "fma_peak" not in name and avx2_peak:
                        highest.append(100 * b["FLOPS"] / avx2_peak)
    if highest:
        row("roofline: the highest % of its peak any kernel row reached", "1-2", [max(highest)], "≤ 100%",
            lambda v: v <= 100)
    binaries = [(a.qkv, "qkv_bench"), (a.backward, "qkv_backward_bench")]
    binaries += list(zip(a.avx2, ("qkv_bench --avx2", "qkv_backward_bench --avx2"))) if a.avx2 else []
    notes = [n for n in (reruns(path, binary) for path, binary in binaries) if n]
    if notes:
        print()
        print("\n".join(notes))
    if a.pinned:
        pinned_table(a.pinned, kernel_rows, bf16_dot)


def reruns(path, binary):
    """What lent_rerun.py did to `binary`'s results at `path`, or None where it ran them once."""
    ctx = context(path)
    runs = ctx.get("lent_runs", [])
    if len(runs) < 2:
        return None
    each = "; ".join(f"run {i + 1} " + ", ".join(f"{100 * q:.0f}% at {t} thr" for t, q in r.items())
                     for i, r in enumerate(runs))
    return (f"{binary} ran {len(runs)} times: the host lent it less than the machine (its own FMA peak against "
            f"the machine probe's best: {each}); the table takes run {ctx['lent_kept'] + 1}.")


def pinned_table(pinned, kernel_rows, bf16_dot):
    """The one-thread kernel rows again, one column per CPU that a run was pinned to, each against
    the best peak that run measured (its forward and backward binaries both time it): the same
    code on two vCPUs of one guest, in the same minutes. The verdict is the best CPU's."""
    runs = []
    for cpu, fwd_path, bwd_path in pinned:
        tables = {"fwd": aggregates(fwd_path, "median"), "bwd": aggregates(bwd_path, "median")}
        fwd_max, bwd_max = aggregates(fwd_path, "max"), aggregates(bwd_path, "max")
        peaks = [p for p in (own_peak(fwd_max, "fp32", 1), own_peak(bwd_max, "fp32", 1)) if p]
        fp32 = max(peaks) if peaks else None
        runs.append((cpu, tables, {"fp32": fp32, "bf16": own_peak(fwd_max, "bf16", 1) or fp32}))
    print()
    print("one thread pinned to each CPU in turn, each row against the peaks measured in the same pinned run: " +
          "; ".join(f"CPU {cpu} fp32 FMA peak {p['fp32'] / 1e9:.1f} GFLOP/s" +
                    (f", {bf16_dot} peak {p['bf16'] / 1e9:.1f}" if bf16_dot and p["bf16"] else "")
                    for cpu, _, p in runs if p["fp32"]))
    print()
    print("| work, 1 thread | " + " | ".join(f"CPU {cpu}" for cpu, _, _ in runs) + " | target | best CPU |")
    print("|---|" + "---|" * len(runs) + "---|---|")
    for work, target, ok, benches in (r for group in kernel_rows for r in group):
        per_cpu = []
        for cpu, tables, peaks in runs:
            vals = [percent_of(tables[tb], name.format(t=1), 1, {1: peaks[pk]}) for tb, name, pk, _ in benches]
            blocks = block_percents(tables["fwd"], benches, peaks["fp32"])  # where this run timed them
            per_cpu.append((cpu, [v for v in vals if v is not None], blocks))
        measured = [(cpu, vals) for cpu, vals, _ in per_cpu if vals]
        if not measured:
            continue
        cpu, best = max(measured, key=lambda cv: min(cv[1]))
        cells = " | ".join((f"{rng(vals)}%" if vals else "not measured") +
                           (f" (the block alone {rng(blocks)}%)" if blocks else "") for _, vals, blocks in per_cpu)
        print(f"| {work} | {cells} | {target} | {verdict(best, ok)} (CPU {cpu}) |")


if __name__ == "__main__":
    main()
