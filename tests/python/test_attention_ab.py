"""bench/attention_ab.cpp (qkv_attention_ab), the in-process A/B of two builds' forward and
backward: run for real against this build's own shared library (the same code on both sides, so
the same bits), and fed bad arguments and libraries it cannot use."""
import re
import subprocess
from pathlib import Path

import pytest

from qkv_testlib import build_dir

BUILD = build_dir()
TOOL = BUILD / "bench" / "qkv_attention_ab"
ROW = re.compile(r"^\| (\S+(?: \S+)?) \| (\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)-([\d.]+) \| (\w+) \|$", re.M)


def tool(*args):
    if not TOOL.exists():
        pytest.skip(f"{TOOL} is not built (QKV_BUILD_BENCH=OFF)")
    return subprocess.run([str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=300)


def own_library():
    libs = sorted(BUILD.glob("libqkv.so.*"))
    if not libs:
        pytest.skip(f"no shared libqkv in {BUILD} (QKV_BUILD_SHARED=OFF)")
    return libs[-1]


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_same_build_on_both_sides_gives_the_same_bits(direction):
    args = ["--shapes", "S1,2x3x37x40", "--threads", "1,2", "--rounds", "3"]
    r = tool(own_library(), *args, *(["--backward"] if direction == "backward" else []))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{direction} A/B in one process"), r.stdout
    rows = ROW.findall(r.stdout)
    assert [(s, t) for s, t, *_ in rows] == [(s, t) for s in ("S1 1x1x3x4", "2x3x37x40") for t in ("1", "2")], r.stdout
    for _, _, a, b, ratio, low, high, bits in rows:
        assert float(a) > 0 and float(b) > 0 and float(low) <= float(ratio) <= float(high), r.stdout
        assert bits == "same", r.stdout


@pytest.mark.parametrize("args, message", [
    ((), "lib_b is required"),
    (("LIB", "--shapes", "S9"), "--shapes: shape 'S9': a name of bench/shapes.h"),
    (("LIB", "--shapes", "2x3x0x4"), "shape '2x3x0x4'"),
    (("LIB", "--shapes", "2x3x4"), "shape '2x3x4'"),
    (("LIB", "--shapes", "65536x65536x65536x2"), "B·H·N·D at most 2^31"),
    (("LIB", "--rounds", "0"), "--rounds"),
    (("LIB", "--threads", "2,x"), "--threads"),
    (("LIB", "--bogus"), "--bogus"),
])
def test_bad_arguments_are_usage_errors(args, message):
    r = tool(*(str(own_library()) if a == "LIB" else a for a in args))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr, r.stderr


def test_a_library_it_cannot_use(tmp_path):
    r = tool(tmp_path / "no-such-lib.so")
    assert r.returncode == 1 and "cannot load" in r.stderr and "no-such-lib.so" in r.stderr, r.stderr
    libm = next((p for p in (Path("/lib/x86_64-linux-gnu/libm.so.6"), Path("/lib/aarch64-linux-gnu/libm.so.6"),
                             Path("/usr/lib64/libm.so.6")) if p.exists()), None)
    if libm is None:
        pytest.skip("no libm.so.6 found to stand for a library without qkv")
    r = tool(libm)
    assert r.returncode == 1 and "has no fp32 qkv::attention_forward and attention_backward" in r.stderr, r.stderr
