"""The hand-run ceiling probes of bench/ (docs/benchmarks.md), run for real: qkv_tile_ceiling_probe,
the fp32 micro-tile's arithmetic against the FMA peak, and qkv_amx_block_probe, the bf16 forward's
key block on AMX tiles against the AMX peak. Their lines and the arithmetic between them are
checked, not the speeds; each is skipped where it is not built or the CPU lacks what it measures."""
import re
import subprocess

import pytest

from qkv_testlib import build_dir

BENCH = build_dir() / "bench"


def run_probe(name, *args, absent=None):
    """Runs the hand-run probe build/bench/<name> with args; skips where it is not built, or where it
    exits 1 with `absent` (the CPU lacks what it measures)."""
    probe = BENCH / name
    if not probe.exists():
        pytest.skip(f"{probe} is not built (QKV_BUILD_BENCH=OFF)")
    r = subprocess.run([str(probe), *args], capture_output=True, text=True, timeout=300)
    if absent is not None and r.returncode == 1 and absent in r.stderr:
        pytest.skip(f"{name}: {r.stderr}")
    return r


def test_tile_ceiling_probe_prints_each_diet_against_the_peak():
    # The micro-tile's arithmetic from registers, with its loads, its broadcasts and both: each a
    # rate and a % of the FMA peak the same process measured (no speed is judged here).
    r = run_probe("qkv_tile_ceiling_probe", absent="this CPU has no AVX-512")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^AVX-512 micro-tile (\d+) x (\d+) \(\d+ FMAs", r.stdout, re.M), r.stdout
    peak = re.search(r"^fp32 FMA peak \(16 chains from registers\) ([0-9.]+) GFLOP/s$", r.stdout, re.M)
    assert peak and float(peak.group(1)) > 0, r.stdout
    for diet in ("registers only", "with B's vector loads", "with A's broadcasts", "with both (the micro-kernel's diet)"):
        m = re.search(rf"^  {re.escape(diet)} +([0-9.]+) GFLOP/s +([0-9.]+)% of the peak$", r.stdout, re.M)
        assert m, (diet, r.stdout)
        rate, pct = float(m.group(1)), float(m.group(2))
        assert rate > 0 and pct == pytest.approx(100 * rate / float(peak.group(1)), abs=0.2), (diet, r.stdout)


def test_tile_ceiling_probe_refuses_arguments():
    r = run_probe("qkv_tile_ceiling_probe", "64")
    assert r.returncode == 2 and "usage: qkv_tile_ceiling_probe (it takes no arguments)" in r.stderr, r


def test_amx_block_probe_prints_each_piece_against_the_amx_peak():
    # The bf16 forward's key block on AMX tiles piece by piece, added, in series and pipelined:
    # each a time, and the products' share of the AMX peak the same process measured (no speed is
    # judged here). Skipped where the CPU or OS gives no AMX tiles, as the forward then uses none.
    r = run_probe("qkv_amx_block_probe", absent="gives no AMX-BF16 tiles")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^bf16 forward key block on AMX tiles: 64 queries x 128 keys, head dims 64, 1 thread;$",
                     r.stdout, re.M), r.stdout
    head = re.search(r"^AMX-BF16 tile peak ([0-9.]+) GFLOP/s; each line's products \(([0-9.]+) MFLOP for both\)",
                     r.stdout, re.M)
    assert head and float(head.group(1)) > 0 and float(head.group(2)) == pytest.approx(2.10), r.stdout
    peak, mflop = float(head.group(1)), float(head.group(2))
    times = {}
    for piece, share in (("scores alone", 0.5), ("softmax alone", 0), ("softmax beside one tile product", 0),
                         ("values and fold alone", 0.5), ("the three times added", 1),
                         ("in series (the kernel's order)", 1), ("pipelined (scores beside the last softmax)", 1)):
        m = re.search(rf"^  {re.escape(piece)} +([0-9.]+) us(?:  +([0-9.]+)% of the peak)?$", r.stdout, re.M)
        assert m, (piece, r.stdout)
        times[piece] = float(m.group(1))
        assert times[piece] > 0 and (m.group(2) is not None) == (share > 0), (piece, r.stdout)
        if share:
            expected = 100 * share * mflop * 1e6 / (times[piece] * 1e-6) / (peak * 1e9)
            assert float(m.group(2)) == pytest.approx(expected, rel=0.01, abs=0.2), (piece, r.stdout)
    added = times["scores alone"] + times["softmax alone"] + times["values and fold alone"]
    assert times["the three times added"] == pytest.approx(added, abs=0.002), r.stdout


def test_amx_block_probe_refuses_arguments():
    r = run_probe("qkv_amx_block_probe", "64")
    assert r.returncode == 2 and "usage: qkv_amx_block_probe (it takes no arguments)" in r.stderr, r
