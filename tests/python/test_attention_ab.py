"""bench/attention_ab.cpp (qkv_attention_ab), the in-process A/B of two builds' forward and
backward: run for real against this build's own shared library (the same code on both sides, so
the same bits), and fed bad arguments and libraries it cannot use."""
import re

import pytest

from qkv_testlib import (AB_USAGE_ERRORS, bench_tool, check_ab_refuses_libraries, check_ab_usage_error,
                         own_shared_library)

tool = bench_tool("qkv_attention_ab")
ROW = re.compile(r"^\| (\S+(?: \S+)?) \| (\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)-([\d.]+) \| (\w+) \|$",
                 re.M)


@pytest.mark.parametrize("direction, flags", [("forward", []), ("backward", ["--backward"]), ("bf16 forward", ["--bf16"])])
def test_same_build_on_both_sides_gives_the_same_bits(direction, flags):
    # 2x3x37x64: the bf16 forward takes AMX tiles where the CPU has them (head dim a multiple of 32).
    args = ["--shapes", "S1,2x3x37x64", "--threads", "1,2", "--rounds", "3"]
    r = tool(own_shared_library(), *args, *flags)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{direction} A/B in one process"), r.stdout
    rows = ROW.findall(r.stdout)
    assert [(s, t) for s, t, *_ in rows] == [(s, t) for s in ("S1 1x1x3x4", "2x3x37x64") for t in ("1", "2")], r.stdout
    for _, _, a, b, ratio, low, high, bits in rows:
        assert float(a) > 0 and float(b) > 0 and float(low) <= float(ratio) <= float(high), r.stdout
        assert bits == "same", r.stdout


@pytest.mark.parametrize("args, message", AB_USAGE_ERRORS + [
    (("LIB", "--shapes", "S9"), "--shapes: shape 'S9': a name of bench/shapes.h"),
    (("LIB", "--shapes", "2x3x0x4"), "shape '2x3x0x4'"),
    (("LIB", "--shapes", "2x3x4"), "shape '2x3x4'"),
    (("LIB", "--shapes", "65536x65536x65536x2"), "B·H·N·D at most 2^31"),
    (("LIB", "--bf16", "--backward"), "--backward excludes --bf16"),
])
def test_bad_arguments_are_usage_errors(args, message):
    check_ab_usage_error(tool, args, message)


def test_a_library_it_cannot_use(tmp_path):
    check_ab_refuses_libraries(tool, tmp_path, "has no qkv::attention_forward (fp32 and bf16) and fp32 attention_backward")
