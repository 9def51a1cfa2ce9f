"""bench/targets.py, the end of `make bench`, on made-up results: the probe is compared with the plain
read round by round where the plain read paired them, else invocation by invocation; the default
pages against the contiguous cache, int8 against f16, and the decode steps against the read
bandwidth by the paired steps when decode_bench measured them, by the benchmarks' medians and the
probe's bandwidth only in older results. Also bench/lent_rerun.py, which runs a benchmark binary
again while the host lends it less than the machine probe measured."""
import json
import os
import re
import subprocess
import sys

import pytest
from pathlib import Path

from qkv_testlib import build_dir

ROOT = Path(__file__).resolve().parents[2]


def machine(bandwidth):
    def rates(t):
        return {"threads": t, "fp32_avx512": {"best": 0}, "fp32_avx2": {"best": 100e9 * t}, "bf16_dot": {"best": 0},
                "bandwidth": {"best": bandwidth * t, "by_streams": [{"streams": s, "median": bandwidth * t}
                                                                    for s in (1, 2, 4, 8)]}}
    return {"brand": "Test CPU", "vendor": "AuthenticAMD", "family": 25, "model": 1, "class": "Zen 3 (AVX2)",
            "l3_bytes": 32 << 20, "l3_source": "sysfs", "eviction_bytes": 256 << 20, "threads": [rates(1), rates(2)]}


def record(name, micros, **counters):
    step_bytes, step_flops = 268435456.0, 536870912.0  # D1 f32 at M = 32768
    return {"run_name": f"decode/{name}/repeats:3/real_time", "aggregate_name": "median", "real_time": micros,
            "time_unit": "us", "GBps": step_bytes / micros / 1e3, "step_bytes": step_bytes, "step_flops": step_flops,
            **counters}


def targets(tmp_path, bandwidths, plains, decode, more_decode=(), overlap=()):
    args = [sys.executable, str(ROOT / "bench" / "targets.py"), "--machine"]
    for i, b in enumerate(bandwidths):
        p = tmp_path / f"machine-{i}.json"
        p.write_text(json.dumps(machine(b)))
        args.append(str(p))
    args.append("--plain")
    for i, pl in enumerate(plains):
        p = tmp_path / f"plain-{i}.json"
        fields = pl if isinstance(pl, dict) else {"threads_1": pl, "threads_2": 2 * pl}
        p.write_text(json.dumps(fields))
        args.append(str(p))
    args.append("--decode")
    for i, benchmarks in enumerate([decode, *more_decode]):
        d = tmp_path / f"decode-{i}.json"
        d.write_text(json.dumps({"context": {"default_page_tokens": "256"}, "benchmarks": benchmarks}))
        args.append(str(d))
    if overlap:
        args.append("--overlap")
    for i, factors in enumerate(overlap):  # {threads: {bits: factor}}
        o = tmp_path / f"overlap-{i}.json"
        o.write_text(json.dumps({"path": "avx512", "bytes_per_thread": 1 << 30, "overlap": {
            str(t): {str(bits): {"factor": f, "both_ns_per_KB": 1.0, "stream_ns_per_KB": 1.0, "fmas_ns_per_KB": 1.0}
                     for bits, f in by_bits.items()} for t, by_bits in factors.items()}}))
        args.append(str(o))
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def row(out, work, threads):
    m = re.search(rf"^\| {re.escape(work)}[^|]* \| {threads} \| ([^|]+) \| [^|]+ \| ([^|]+) \|$", out, re.M)
    assert m, out
    return m.group(1).strip(), m.group(2).strip()


def test_probe_against_the_plain_read_pair_by_pair(tmp_path):
    # The memory drifts from 20 to 30 GB/s between invocations; each plain read 4% under its probe.
    out = targets(tmp_path, [20e9, 25e9, 30e9], [20e9 / 1.04, 25e9 / 1.04, 30e9 / 1.04], [])
    assert row(out, "roofline: probe vs a plain multi-stream read (paired)", 1) == ("+4.0%", "met")
    assert row(out, "roofline: bandwidth spread over 3 invocations", 1) == ("40.0%", "not met")
    assert "best of 1-8 streams per thread" in out


def test_probe_against_the_plain_read_round_by_round(tmp_path):
    # Invocation by invocation the probe reads 20% above the plain read run after it (the host sped
    # up in between); the plain read's own rounds, each beside a call of the probe, say -1 to +3%.
    plains = [{"threads_1": 20e9 / 1.2, "threads_2": 40e9 / 1.2, "probe_vs_plain_pct_1": pct,
               "probe_vs_plain_pct_2": pct} for pct in (-1.0, 1.5, 3.0)]
    out = targets(tmp_path, [20e9, 20e9, 20e9], plains, [])
    assert row(out, "roofline: probe vs a plain multi-stream read (paired)", 1) == ("+1.5%", "met")
    assert "round by round in one process" in out
    for pl in plains:
        pl.pop("probe_vs_plain_pct_1")
        pl.pop("probe_vs_plain_pct_2")
    out = targets(tmp_path, [20e9, 20e9, 20e9], plains, [])  # results from before: invocation by invocation
    assert row(out, "roofline: probe vs a plain multi-stream read (paired)", 2) == ("+20.0%", "not met")


def test_pages_against_contiguous_by_the_paired_steps(tmp_path):
    decode = []
    for t in (1, 2):
        for d in ("f32", "bf16", "f16", "i8"):
            # The medians say pages cost 20% (the host slowed between the two benchmarks); the pairs say 1-2%.
            decode.append(record(f"D1/{d}/M:32768/cold/threads:{t}", 1000.0))
            decode.append(record(f"D1/{d}/M:32768/paged256/cold/threads:{t}", 1200.0,
                                 vs_partner_pct=1.0 if d == "i8" else 2.0))
    out = targets(tmp_path, [20e9], [20e9], decode)
    work = "decode in default pages (256 tokens) vs contiguous, M = 32k, time"
    assert row(out, work, 1) == ("+1-+2%", "met")
    for r in decode:
        r.pop("vs_partner_pct", None)
    out = targets(tmp_path, [20e9], [20e9], decode)  # results from before the pairing
    assert row(out, work, 2) == ("+20%", "not met")


def test_int8_against_f16_by_the_paired_steps(tmp_path):
    decode = []
    for t in (1, 2):
        for M in (16384, 32768):
            # The medians say int8 takes as long as f16; its steps beside f16's say 20% less time.
            decode.append(record(f"D1/f16/M:{M}/cold/threads:{t}", 1000.0))
            decode.append(record(f"D1/i8/M:{M}/cold/threads:{t}", 1000.0, vs_partner_pct=-20.0))
    out = targets(tmp_path, [20e9], [20e9], decode)
    work = "decode int8: f16's step time / int8's, M ≥ 16k"
    assert row(out, work, 1)[0].startswith("1.25×"), out
    for r in decode:
        r.pop("vs_partner_pct", None)
    out = targets(tmp_path, [20e9], [20e9], decode)
    assert row(out, work, 2)[0].startswith("1.00×"), out


def test_decode_rows_take_the_median_over_processes(tmp_path):
    # qkv_decode_bench ran in three processes, each with its own placement of the caches: int8's
    # steps beside f16's took 20%, 40% and 30% less time. The row takes the median, 30% (1.43×),
    # not the first process's 1.25×. A benchmark only the first process ran keeps its own value.
    runs = [[record(f"D1/{d}/M:{M}/cold/threads:{t}", 1000.0, **({"vs_partner_pct": pct} if d == "i8" else {}))
             for t in (1, 2) for M in (16384, 32768) for d in ("f16", "i8")] for pct in (-20.0, -40.0, -30.0)]
    runs[0] += [record(f"D1/i8/M:32768/paged256/cold/threads:{t}", 1000.0, vs_partner_pct=3.0) for t in (1, 2)]
    work = "decode int8: f16's step time / int8's, M ≥ 16k"
    one = targets(tmp_path, [20e9], [20e9], runs[0])
    assert row(one, work, 1)[0].startswith("1.25×") and "more than one process" not in one, one
    out = targets(tmp_path, [20e9], [20e9], runs[0], more_decode=runs[1:])
    assert row(out, work, 1)[0].startswith("1.43×"), out
    assert row(out, "decode in default pages (256 tokens) vs contiguous, M = 32k, time", 2) == ("+3%", "met"), out
    assert "each benchmark qkv_decode_bench ran in more than one process (3 processes) is the median" in out, out


def test_int8_ceiling_divides_both_floors_by_the_same_bandwidth(tmp_path):
    # The f16 steps ran beside a 10 GB/s read (the host busy), the probe read 20 GB/s; int8's steps
    # ran beside f16's, in the same minutes. int8 has half of f16's bytes and the FMA peak is far
    # off, so the ceiling is 2× whichever one bandwidth divides both; mixing f16's 10 GB/s with the
    # probe's 20 for int8 made it 4×.
    decode = []
    for t in (1, 2):
        for M in (16384, 32768):
            decode.append(record(f"D1/f16/M:{M}/cold/threads:{t}", 30000.0, read_pct=90.0, read_GBps=10.0))
            i8 = record(f"D1/i8/M:{M}/cold/threads:{t}", 20000.0, vs_partner_pct=-33.0)
            i8["step_bytes"] /= 2
            decode.append(i8)
    out = targets(tmp_path, [20e9], [20e9], decode)
    work = "decode int8: f16's step time / int8's, M ≥ 16k"
    for t in (1, 2):
        assert "(with both steps at their floors 2.00×)" in row(out, work, t)[0], out


def test_decode_against_the_read_beside_each_step(tmp_path):
    decode = []
    for t in (1, 2):
        for d in ("f32", "bf16", "f16"):
            for M in (16384, 32768):
                # The probe read 20 GB/s minutes earlier; beside the steps the memory read 10 GB/s, and
                # each step streamed at 80% of the read run beside it.
                decode.append(record(f"D1/{d}/M:{M}/cold/threads:{t}", 268435456.0 / 8e9 * 1e6,
                                     read_pct=80.0, read_GBps=10.0))
    out = targets(tmp_path, [20e9], [20e9], decode)
    work = "decode D1, M ≥ 16k, f32/f16/bf16, % of read bandwidth"
    assert row(out, work, 1) == ("80% (ceiling 100%)", "met")
    assert row(out, work, 2) == ("80% (ceiling 100%)", "not met")
    assert "those reads' medians 10.0 GB/s at 1 thread, 10.0 GB/s at 2 threads" in out
    for r in decode:
        r.pop("read_pct")
        r.pop("read_GBps")
    out = targets(tmp_path, [20e9], [20e9], decode)  # results from before the pairing: the probe's 20 GB/s
    assert row(out, work, 1) == ("40% (ceiling 100%)", "not met")
    assert "beside a plain read" not in out


def test_decode_ceilings_take_the_best_overlap_the_probe_measured(tmp_path):
    # Steps at 80% of the read beside them, memory-bound (the FMA peak far off). Two probe runs: at
    # one thread the best overlap of 32-bit rows was 1.25 (ceiling 80%), of 16-bit rows 1.6 (62.5%);
    # at two threads a run read below 1 (a full overlap at most: ceiling 100%).
    decode = [record(f"D1/{d}/M:{M}/cold/threads:{t}", 268435456.0 / 8e9 * 1e6, read_pct=80.0, read_GBps=10.0)
              for t in (1, 2) for d in ("f32", "bf16", "f16") for M in (16384, 32768)]
    runs = [{1: {32: 1.25, 16: 2.0, 8: 1.0}, 2: {32: 0.9, 16: 1.1, 8: 1.0}},
            {1: {32: 1.5, 16: 1.6, 8: 1.0}, 2: {32: 1.2, 16: 0.95, 8: 1.0}}]
    out = targets(tmp_path, [20e9], [20e9], decode, overlap=runs)
    work = "decode D1, M ≥ 16k, f32/f16/bf16, % of read bandwidth"
    assert row(out, work, 1) == ("80% (ceiling 62-80%)", "met")
    assert row(out, work, 2) == ("80% (ceiling 100%)", "not met")
    assert "the best of 2 runs): the longer of the two times 1.25, 1.60, 1.00 at 1 thread; 0.90, 0.95, 1.00 at 2 threads" \
        in out, out
    out = targets(tmp_path, [20e9], [20e9], decode)  # no probe run: a full overlap
    assert row(out, work, 1) == ("80% (ceiling 100%)", "met")
    assert "overlap" not in out


def test_real_overlap_probe_feeds_targets(tmp_path):
    probe = BENCH / "qkv_decode_floor_probe"
    if not probe.exists():
        pytest.skip(f"{probe} is not built (QKV_BUILD_BENCH=OFF, or not x86-64)")
    r = subprocess.run([str(probe), "--overlap", "64"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and not r.stdout:
        pytest.skip(f"this CPU does not run the AVX-512 probe ({r.returncode}): {r.stderr}")
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert o["path"] == "avx512" and o["bytes_per_thread"] == 64 << 20, o
    assert set(o["overlap"]) == {"1", "2"}, o
    for by_bits in o["overlap"].values():
        assert set(by_bits) == {"32", "16", "8"}, o
        for f in by_bits.values():
            assert f["both_ns_per_KB"] > 0 and f["stream_ns_per_KB"] > 0 and f["fmas_ns_per_KB"] > 0, o
            assert f["factor"] == pytest.approx(f["both_ns_per_KB"] / max(f["stream_ns_per_KB"], f["fmas_ns_per_KB"]),
                                                rel=1e-3), o
    (tmp_path / "overlap.json").write_text(r.stdout)
    (tmp_path / "machine-0.json").write_text(json.dumps(machine(20e9)))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py"), "--machine", str(tmp_path / "machine-0.json"),
                        "--overlap", str(tmp_path / "overlap.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "decode floors' overlap" in r.stdout and "qkv_decode_floor_probe --overlap, one run)" in r.stdout, r.stdout


@pytest.mark.parametrize("args", [["--overlap", "0"], ["--overlap", "4097"], ["--overlap", "64", "2"],
                                  ["--overlap", "x"], ["--overlap", "64abc"], ["--overlap", "-5"],
                                  ["--overlap", "99999999999999999999"], ["--overlap", ""]])
def test_overlap_probe_refuses_bad_sizes(args):
    probe = BENCH / "qkv_decode_floor_probe_avx2"
    if not probe.exists():
        pytest.skip(f"{probe} is not built (QKV_BUILD_BENCH=OFF, or not x86-64)")
    r = subprocess.run([str(probe), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "usage: qkv_decode_floor_probe --overlap [MiB per thread, 1-4096; default 1024]" in r.stderr, r.stderr
    assert r.stdout == ""


def bench_file(path, aggregates):
    """A Google Benchmark JSON of {run_name: FLOPS} for each aggregate in `aggregates`."""
    path.write_text(json.dumps({"benchmarks": [
        {"run_name": f"{name}/repeats:5/real_time", "aggregate_name": stat, "FLOPS": flops, "real_time": 1.0,
         "time_unit": "ms"} for stat, runs in aggregates.items() for name, flops in runs.items()]}))
    return str(path)


def test_pinned_rows_per_cpu_against_that_runs_own_peak(tmp_path):
    # CPU 0's run measured a 200 GFLOP/s peak and S3 at 140 (70%); CPU 1's a 250 peak (its
    # backward binary's, the higher of its two) and S3 at 215 (86%). Each row divides by its own
    # CPU's peak, and the verdict is the best CPU's. A row neither run measured is left out.
    def pinned(cpu, fwd_peak, bwd_peak, s3, s2_bwd):
        fwd = bench_file(tmp_path / f"pinned-{cpu}.json",
                         {"median": {"attention/S3/fp32/threads:1": s3, "attention/S4/fp32/threads:1": s3,
                                     "attention/S6/fp32/threads:1": s3, "fma_peak/threads:1": fwd_peak},
                          "max": {"fma_peak/threads:1": fwd_peak}})
        bwd = bench_file(tmp_path / f"pinned-backward-{cpu}.json",
                         {"median": {"backward/S2/fp32/threads:1": s2_bwd}, "max": {"fma_peak/threads:1": bwd_peak}})
        return ["--pinned", str(cpu), fwd, bwd]

    (tmp_path / "machine-0.json").write_text(json.dumps(machine(20e9)))
    args = [sys.executable, str(ROOT / "bench" / "targets.py"), "--machine", str(tmp_path / "machine-0.json")]
    args += pinned(0, 200e9, 190e9, 140e9, 160e9) + pinned(1, 240e9, 250e9, 215e9, 150e9)
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "CPU 0 fp32 FMA peak 200.0 GFLOP/s; CPU 1 fp32 FMA peak 250.0 GFLOP/s" in out, out
    assert "| work, 1 thread | CPU 0 | CPU 1 | target | best CPU |" in out, out
    assert "| prefill fp32 S3/S4/S6 (N ≥ 1024), % of FMA peak | 70% | 86% | ≥ 85% | met (CPU 1) |" in out, out
    assert "| short heads S2 backward | 80% | 60% | ≥ 75% | met (CPU 0) |" in out, out
    assert "short heads S2 forward |" not in out.split("best CPU |")[1], out


def test_pinned_rows_print_the_blocks_their_own_run_timed(tmp_path):
    # CPU 0's pinned run timed the blocks (fused_D64 160 and fused_D128 180 GFLOP/s against its
    # 200 peak: 80-90%); CPU 1's did not (an older run), so its cells carry none.
    def pinned(cpu, blocks):
        fwd = bench_file(tmp_path / f"pinned-{cpu}.json", {
            "median": {f"attention/{s}/fp32/threads:1": 140e9 for s in ("S3", "S4", "S6")} | blocks,
            "max": {"fma_peak/threads:1": 200e9}})
        bwd = bench_file(tmp_path / f"pinned-backward-{cpu}.json", {"median": {}, "max": {}})
        return ["--pinned", str(cpu), fwd, bwd]

    (tmp_path / "machine-0.json").write_text(json.dumps(machine(20e9)))
    args = [sys.executable, str(ROOT / "bench" / "targets.py"), "--machine", str(tmp_path / "machine-0.json")]
    args += pinned(0, {"microkernel/fused_D64": 160e9, "microkernel/fused_D128": 180e9}) + pinned(1, {})
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert ("| prefill fp32 S3/S4/S6 (N ≥ 1024), % of FMA peak | 70% (the block alone 80-90%) | 70% | ≥ 85% | "
            "not met (CPU 0) |") in r.stdout, r.stdout


def test_row_says_when_its_binary_was_lent_less_than_the_best_peak(tmp_path):
    # The machine's best 2-thread peak is 200 GFLOP/s; the forward binary's own read 100 (the host
    # lent its two threads one core's worth), and S3/S4/S6 reached 90: 45% of the best, 90% of its
    # own. At one thread its own peak (99) is within 10% of the best (100): nothing added.
    names = {f"attention/{s}/fp32/threads:{t}": 90e9 for s in ("S3", "S4", "S6") for t in (1, 2)}
    fwd = bench_file(tmp_path / "qkv.json", {"median": names, "max": {"fma_peak/threads:1": 99e9,
                                                                       "fma_peak/threads:2": 100e9}})
    (tmp_path / "machine-0.json").write_text(json.dumps(machine(20e9)))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py"), "--machine", str(tmp_path / "machine-0.json"),
                        "--qkv", fwd], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    work = "prefill fp32 S3/S4/S6 (N ≥ 1024), % of FMA peak"
    assert row(r.stdout, work, 2) == ("45%; 90% of the lower peak its binary measured before and after its rows, "
                                      "which read 50% of the run's best", "not met")
    assert row(r.stdout, work, 1) == ("90%", "met")


def test_lent_is_judged_by_the_lower_peak_and_the_ceiling_by_the_higher(tmp_path):
    # The forward binary's 2-thread peak read 200 GFLOP/s before its rows, the machine's best, and
    # 100 after them: the host lent its later minutes half. lent_rerun.py's ratio (whether it runs
    # the binary again) is the lower peak's, and the row says what it reached against that one.
    # Where the peak after the rows is the binary's best (250, above the probe's 200), it is the
    # ceiling the rows divide by, and the 200 before them reads 80% of it.
    sys.path.insert(0, str(ROOT / "bench"))
    import lent_rerun
    names = {f"attention/{s}/fp32/threads:2": 90e9 for s in ("S3", "S4", "S6")}
    (tmp_path / "machine-0.json").write_text(json.dumps(machine(20e9)))
    work = "prefill fp32 S3/S4/S6 (N ≥ 1024), % of FMA peak"
    for after, ratio, expected in ((100e9, 0.5, "45%; 90% of the lower peak its binary measured before and after its "
                                                "rows, which read 50% of the run's best"),
                                   (250e9, 1.0, "36%; 45% of the lower peak its binary measured before and after "
                                                "its rows, which read 80% of the run's best")):
        fwd = bench_file(tmp_path / "qkv.json", {"median": names, "max": {"fma_peak/threads:2": 200e9,
                                                                           "fma_peak/after/threads:2": after}})
        assert lent_rerun.ratios(fwd, [machine(20e9)]) == {2: ratio}
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py"), "--machine",
                            str(tmp_path / "machine-0.json"), "--qkv", fwd], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert row(r.stdout, work, 2) == (expected, "not met"), r.stdout


def test_kernel_rows_print_what_their_block_reaches_alone(tmp_path):
    # One core's peak 200 GFLOP/s; the forward's blocks alone reach 160 (D = 64) and 170 (D = 128),
    # the backward's 150 at D = 64 and nothing measured at 128. Each fp32 row prints the blocks of
    # its shapes' head dims as a % of the one-thread peak, at either thread count; the bf16 row,
    # with no block of its own, prints none; the verdict stays the row's own.
    fwd_rows = {f"attention/{s}/fp32/threads:{t}": 150e9 * t for s in ("S2", "S3", "S4", "S6", "S3q50") for t in (1, 2)}
    fwd_rows |= {f"attention/{s}/bf16/threads:{t}": 150e9 * t for s in ("S3", "S4") for t in (1, 2)}
    fwd_rows |= {"microkernel/fused_D64": 160e9, "microkernel/fused_D128": 170e9, "microkernel/backward_D64": 150e9}
    peaks = {"fma_peak/threads:1": 200e9, "fma_peak/threads:2": 400e9}
    fwd = bench_file(tmp_path / "qkv.json", {"median": fwd_rows, "max": peaks})
    bwd = bench_file(tmp_path / "backward.json", {
        "median": {f"backward/{s}/fp32/threads:{t}": 140e9 * t for s in ("S2", "S3", "S4", "S6") for t in (1, 2)},
        "max": peaks})
    (tmp_path / "machine-0.json").write_text(json.dumps(machine(20e9)))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py"), "--machine", str(tmp_path / "machine-0.json"),
                        "--qkv", fwd, "--backward", bwd], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for t in (1, 2):
        assert row(out, "prefill fp32 S3/S4/S6 (N ≥ 1024), % of FMA peak", t) == (
            "75% (the block alone 80-85%)", "not met"), out
        assert row(out, "backward fp32 S3/S4/S6, % of FMA peak", t) == ("70% (the block alone 75%)", "not met"), out
        assert row(out, "short heads S2 forward", t) == ("75% (the block alone 80%)", "not met"), out
        assert row(out, "short heads S2 backward", t) == ("70% (the block alone 75%)", "not met"), out
        assert row(out, "large scores S3q50, % of FMA peak", t) == ("75% (the block alone 80%)", "met"), out
        assert "block alone" not in row(out, "prefill bf16 S3/S4", t)[0], out


def test_bf16_rows_divide_by_the_amx_peak_where_the_probe_measured_it(tmp_path):
    # The bf16 forward runs on AMX tiles where the OS grants them: 1,500 GFLOP/s is 50% of a 3,000
    # GFLOP/s tile peak, not 1,500% of the 100 GFLOP/s vdpbf16ps peak. Without AMX (bf16_amx 0,
    # or absent in older results) the row divides by vdpbf16ps's.
    fwd = bench_file(tmp_path / "qkv.json", {"median": {f"attention/{s}/bf16/threads:1": 1500e9 for s in ("S3", "S4")},
                                             "max": {"fma_peak/threads:1": 200e9}})
    for amx, work, expected in ((3000e9, "prefill bf16 S3/S4, % of bf16 AMX tile peak", "50%"),
                                (0, "prefill bf16 S3/S4, % of bf16 dot peak", "1500%")):
        m = machine(20e9)
        for r in m["threads"]:
            r["bf16_dot"] = {"best": 100e9 * r["threads"]}
            r["bf16_amx"] = {"best": amx * r["threads"]}
        (tmp_path / "machine-0.json").write_text(json.dumps(m))
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py"), "--machine",
                            str(tmp_path / "machine-0.json"), "--qkv", fwd], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert row(r.stdout, work, 1)[0] == expected, r.stdout
    assert "bf16 dot peak 100.0 GFLOP/s" in r.stdout


def test_kernel_rows_on_avx2_take_the_blocks_of_the_avx2_run(tmp_path):
    # A CPU whose kernels run AVX2 has no AVX-512 blocks in qkv_bench's own run: the rows take the
    # blocks of its --avx2 run (130 GFLOP/s against the 200 peak), and an AVX-512 machine's rows
    # never take those.
    peaks = {"fma_peak/threads:1": 200e9, "fma_peak/threads:2": 400e9}
    fwd = bench_file(tmp_path / "qkv.json", {"median": {"attention/S3/fp32/threads:1": 150e9}, "max": peaks})
    avx2 = bench_file(tmp_path / "avx2.json", {"median": {"avx2/microkernel/fused_D64": 130e9}, "max": {}})
    avx2_bwd = bench_file(tmp_path / "avx2_backward.json", {"median": {}, "max": {}})
    for simd, expected in (("avx2", "75% (the block alone 65%)"), ("avx512", "75%")):
        (tmp_path / "machine-0.json").write_text(json.dumps(dict(machine(20e9), simd=simd)))
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py"), "--machine",
                            str(tmp_path / "machine-0.json"), "--qkv", fwd, "--avx2", avx2, avx2_bwd],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert row(r.stdout, "prefill fp32 S3/S4/S6 (N ≥ 1024), % of FMA peak", 1) == (expected, "not met"), r.stdout


BENCH = build_dir() / "bench"


def test_real_plain_read_and_decode_steps_feed_targets(tmp_path):
    # The two binaries that write the paired fields, run for real (one short benchmark), so a
    # change to their names or format fails here rather than in the next `make bench`.
    plain_read, decode_bench = BENCH / "qkv_plain_read", BENCH / "qkv_decode_bench"
    if not plain_read.exists() or not decode_bench.exists():
        pytest.skip(f"the benchmarks are not built in {BENCH} (QKV_BUILD_BENCH=OFF, or not x86-64)")
    r = subprocess.run([str(plain_read)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    plain = json.loads(r.stdout)
    for t in (1, 2):
        assert plain[f"threads_{t}"] > 1e8 and plain[f"probe_{t}"] > 1e8, plain
        assert -90 < plain[f"probe_vs_plain_pct_{t}"] < 900, plain
        assert set(plain[f"by_streams_{t}"]) == {"1", "2", "4", "8"}, plain
    out = tmp_path / "decode.json"
    r = subprocess.run([str(decode_bench), "--benchmark_filter=^decode/D1/f16/M:4096/cold/threads:1/",
                        "--benchmark_repetitions=3", "--benchmark_min_time=0.01", f"--benchmark_out={out}",
                        "--benchmark_out_format=json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    decode = json.loads(out.read_text())
    median = [b for b in decode["benchmarks"] if b.get("aggregate_name") == "median"]
    assert len(median) == 1, decode["benchmarks"]
    step = median[0]
    assert step["read_GBps"] > 0.1 and 1 < step["read_pct"] < 1000, step
    (tmp_path / "plain-0.json").write_text(json.dumps(plain))
    (tmp_path / "machine-0.json").write_text(json.dumps(machine(20e9)))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py"), "--machine", str(tmp_path / "machine-0.json"),
                        "--plain", str(tmp_path / "plain-0.json"), "--decode", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "round by round in one process" in r.stdout
    assert f"those reads' medians {step['read_GBps']:.1f} GB/s at 1 thread" in r.stdout, r.stdout


def test_lent_rerun_runs_again_while_the_host_lends_less_and_keeps_the_best_run(tmp_path):
    # The real qkv_bench, its one-thread FMA peak only (seconds). Against a machine whose probe read
    # ten times that peak, every run looks lent: the runner runs it the three times it may, keeps
    # the run with the best ratio and says why on stderr; targets.py says so under its table.
    # Against a machine whose probe read a tenth, it runs once.
    binary = BENCH / "qkv_bench"
    if not binary.exists():
        pytest.skip(f"the benchmarks are not built in {BENCH} (QKV_BUILD_BENCH=OFF, or not x86-64)")

    def rerun(peak, name, args=("--benchmark_filter=^fma_peak/threads:1/",), avx2_peak=100e9):
        m = machine(20e9)
        m["threads"][0]["fp32_avx512"]["best"] = peak
        m["threads"][0]["fp32_avx2"]["best"] = avx2_peak
        (tmp_path / f"{name}-machine.json").write_text(json.dumps(m))
        out = tmp_path / f"{name}.json"
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "lent_rerun.py"), "--machine",
                            str(tmp_path / f"{name}-machine.json"), "--out", str(out), "--", str(binary), *args],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "fma_peak/threads:1" in r.stdout, r.stdout
        assert sorted(os.listdir(tmp_path)) == sorted(f for f in os.listdir(tmp_path) if ".run" not in f)
        return json.loads(out.read_text()), r.stderr, str(out), str(tmp_path / f"{name}-machine.json")

    lent, err, path, machine_path = rerun(10e12, "lent")
    runs = lent["context"]["lent_runs"]
    assert len(runs) == 3 and all(set(r) == {"1"} and 0 < r["1"] < 0.1 for r in runs), runs
    assert lent["context"]["lent_kept"] == max(range(3), key=lambda i: runs[i]["1"])
    assert err.count("less than the machine") == 2 and "at 1 thread of the machine probe's best" in err, err
    own = [b["FLOPS"] for b in lent["benchmarks"] if b["run_name"].startswith("fma_peak/threads:1/")
           and b.get("aggregate_name") == "max"]
    assert own and abs(own[0] / 10e12 - runs[lent["context"]["lent_kept"]]["1"]) < 1e-9
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py"), "--machine", machine_path, "--qkv", path],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "qkv_bench ran 3 times: the host lent it less than the machine" in out.stdout, out.stdout
    assert f"the table takes run {lent['context']['lent_kept'] + 1}." in out.stdout, out.stdout

    # An AVX2 run is judged by its AVX2 peak against the probe's AVX2 figure (here 1 GFLOP/s, which
    # the real peak passes under any load), not against the AVX-512 peak.
    avx2, err, path, machine_path = rerun(10e12, "avx2", ["--avx2", "--benchmark_filter=^avx2/fma_peak/threads:1/"],
                                          avx2_peak=1e9)
    assert len(avx2["context"]["lent_runs"]) == 1 and avx2["context"]["lent_runs"][0]["1"] > 0.5, avx2["context"]
    assert "less than the machine" not in err, err

    fine, err, _, _ = rerun(1e9, "fine")
    assert fine["context"]["lent_kept"] == 0 and len(fine["context"]["lent_runs"]) == 1, fine["context"]
    assert "less than the machine" not in err, err


def test_lent_rerun_refuses_bad_arguments_and_a_binary_that_cannot_run(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps(machine(20e9)))
    base = [sys.executable, str(ROOT / "bench" / "lent_rerun.py"), "--machine", str(tmp_path / "m.json"),
            "--out", str(tmp_path / "o.json")]
    r = subprocess.run(base + ["--"], capture_output=True, text=True)
    assert r.returncode == 2 and "no benchmark binary given after --" in r.stderr, r.stderr
    r = subprocess.run(base + ["--tries", "0", "--", "true"], capture_output=True, text=True)
    assert r.returncode == 2 and "--tries must be at least 1" in r.stderr, r.stderr
    r = subprocess.run(base + ["--", str(tmp_path / "no-such-bench")], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("lent_rerun.py: cannot run ") and "no-such-bench" in r.stderr, r.stderr
    r = subprocess.run(base + ["--", "false"], capture_output=True, text=True)
    assert r.returncode == 1 and "lent_rerun.py: cannot run false: it exited with 1" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["m.json"]  # no run's file left behind


def test_real_block_benchmarks_feed_the_kernel_rows(tmp_path):
    # qkv_bench's own block benchmarks and peak, run for real (briefly), so a change to their names
    # fails here rather than in the next `make bench`.
    qkv_bench = BENCH / "qkv_bench"
    if not qkv_bench.exists():
        pytest.skip(f"qkv_bench is not built in {BENCH} (QKV_BUILD_BENCH=OFF, or not x86-64)")
    out = tmp_path / "qkv.json"
    r = subprocess.run([str(qkv_bench), "--benchmark_filter=^(fma_peak/threads:1/|microkernel/(fused|backward)_D)",
                        "--benchmark_min_time=0.01", f"--benchmark_out={out}", "--benchmark_out_format=json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    blocks = [b["run_name"] for b in json.loads(out.read_text())["benchmarks"] if "microkernel/" in b["run_name"]]
    if not blocks:
        pytest.skip("this CPU has no AVX-512, which qkv_bench's block benchmarks need")
    (tmp_path / "machine-0.json").write_text(json.dumps(machine(20e9)))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py"), "--machine", str(tmp_path / "machine-0.json"),
                        "--qkv", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for work in ("prefill fp32 S3/S4/S6 (N ≥ 1024), % of FMA peak", "backward fp32 S3/S4/S6, % of FMA peak"):
        measured, verdict = row(r.stdout, work, 1)
        assert re.fullmatch(r"not measured \(the block alone [0-9]+(-[0-9]+)?%\)", measured), r.stdout
        assert verdict == "n/a", r.stdout


def test_decode_filter_selects_the_cold_steps_the_targets_take():
    # bench/run.sh runs the steps this filter selects in two more processes: every cold D1 step at
    # M ≥ 16k (contiguous and paged) and every cold D8 step, and nothing else.
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py"), "--decode-filter"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    flt = re.compile(r.stdout.strip())
    for name in ("decode/D1/i8/M:16384/cold/threads:1/", "decode/D1/f16/M:32768/paged256/cold/threads:2/",
                 "decode/D8/f32/paged256/cold/threads:1/"):
        assert flt.search(name), (r.stdout, name)
    for name in ("decode/D1/f16/M:4096/cold/threads:1/", "decode/D1/f16/M:32768/hot/threads:2/",
                 "decode/D2/f16/paged16_shuffled/cold/threads:2/", "decode/D8/f16/paged256/hot/threads:2/"):
        assert not flt.search(name), (r.stdout, name)
    binary = BENCH / "qkv_decode_bench"
    if binary.exists():  # the real names, so that a rename there fails here
        listed = subprocess.run([str(binary), f"--benchmark_filter={r.stdout.strip()}", "--benchmark_list_tests"],
                                capture_output=True, text=True, timeout=60).stdout.split()
        assert len(listed) == 30 and all("/cold/" in n for n in listed), listed
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "targets.py")], capture_output=True, text=True)
    assert r.returncode == 2 and "the following arguments are required: --machine" in r.stderr, r.stderr
