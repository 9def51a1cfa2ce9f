"""bench/decode_ab.cpp (qkv_decode_ab), the in-process A/B of two builds' decode: run for real
against this build's own shared library (the same code on both sides, so the same bits), and fed
bad arguments and libraries it cannot use."""
import re

import pytest

from qkv_testlib import (AB_USAGE_ERRORS, bench_tool, check_ab_refuses_libraries, check_ab_usage_error,
                         own_shared_library)

tool = bench_tool("qkv_decode_ab")


def test_same_build_on_both_sides_gives_the_same_bits():
    r = tool(own_shared_library(), "--hot", "--tokens", "100,3", "--dtypes", "f16,i8", "--threads", "1,2",
             "--rounds", "3")
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^\| (\w+) \| (\d+) \| (\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (\w+) \|$", r.stdout, re.M)
    assert [(d, m, t) for d, m, t, *_ in rows] == [(d, m, t) for d in ("f16", "i8") for m in ("100", "3")
                                                    for t in ("1", "2")], r.stdout
    for _, _, _, a, b, ratio, bits in rows:
        assert float(a) > 0 and float(b) > 0 and float(ratio) > 0, r.stdout
        assert bits == "same", r.stdout
    assert "hot (one copy of each cache)" in r.stdout, r.stdout


def test_a_batch_of_sequences():
    r = tool(own_shared_library(), "--hot", "--batch", "3", "--tokens", "5", "--dtypes", "bf16", "--rounds", "1")
    assert r.returncode == 0, r.stderr
    assert "B3 H32 Hkv8 D128" in r.stdout, r.stdout
    assert re.search(r"^\| bf16 \| 5 \| 1 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| same \|$", r.stdout, re.M), r.stdout


@pytest.mark.parametrize("args, message", AB_USAGE_ERRORS + [
    (("LIB", "--dtypes", "f17"), "--dtypes: a dtype must be 'f32', 'bf16', 'f16' or 'i8', got 'f17'"),
    (("LIB", "--tokens", "0"), "--tokens"),
    (("LIB", "--batch", "0"), "--batch"),
])
def test_bad_arguments_are_usage_errors(args, message):
    check_ab_usage_error(tool, args, message)


def test_a_cache_larger_than_the_machine_is_refused_by_name():
    r = tool(own_shared_library(), "--hot", "--batch", "1024", "--tokens", str(1 << 24), "--rounds", "1")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "qkv_decode_ab: KVCache: the key pages: cannot allocate " in r.stderr, r.stderr


def test_a_library_it_cannot_use(tmp_path):
    check_ab_refuses_libraries(tool, tmp_path, "has no qkv::decode_attention over a PagedKV")
