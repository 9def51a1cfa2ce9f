"""bench/decode_ab.cpp (qkv_decode_ab), the in-process A/B of two builds' decode: run for real
against this build's own shared library (the same code on both sides, so the same bits), and fed
bad arguments and libraries it cannot use."""
import re
import subprocess
from pathlib import Path

import pytest

from qkv_testlib import build_dir

BUILD = build_dir()
TOOL = BUILD / "bench" / "qkv_decode_ab"


def tool(*args):
    if not TOOL.exists():
        pytest.skip(f"{TOOL} is not built (QKV_BUILD_BENCH=OFF)")
    return subprocess.run([str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=300)


def own_library():
    libs = sorted(BUILD.glob("libqkv.so.*"))
    if not libs:
        pytest.skip(f"no shared libqkv in {BUILD} (QKV_BUILD_SHARED=OFF)")
    return libs[-1]


def test_same_build_on_both_sides_gives_the_same_bits():
    r = tool(own_library(), "--hot", "--tokens", "100,3", "--dtypes", "f16,i8", "--threads", "1,2", "--rounds", "3")
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^\| (\w+) \| (\d+) \| (\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (\w+) \|$", r.stdout, re.M)
    assert [(d, m, t) for d, m, t, *_ in rows] == [(d, m, t) for d in ("f16", "i8") for m in ("100", "3")
                                                    for t in ("1", "2")], r.stdout
    for _, _, _, a, b, ratio, bits in rows:
        assert float(a) > 0 and float(b) > 0 and float(ratio) > 0, r.stdout
        assert bits == "same", r.stdout
    assert "hot (one copy of each cache)" in r.stdout, r.stdout


def test_a_batch_of_sequences():
    r = tool(own_library(), "--hot", "--batch", "3", "--tokens", "5", "--dtypes", "bf16", "--rounds", "1")
    assert r.returncode == 0, r.stderr
    assert "B3 H32 Hkv8 D128" in r.stdout, r.stdout
    assert re.search(r"^\| bf16 \| 5 \| 1 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| same \|$", r.stdout, re.M), r.stdout


@pytest.mark.parametrize("args, message", [
    ((), "lib_b is required"),
    (("LIB", "--dtypes", "f17"), "--dtypes: a dtype must be 'f32', 'bf16', 'f16' or 'i8', got 'f17'"),
    (("LIB", "--rounds", "0"), "--rounds"),
    (("LIB", "--tokens", "0"), "--tokens"),
    (("LIB", "--threads", "2,x"), "--threads"),
    (("LIB", "--batch", "0"), "--batch"),
    (("LIB", "--bogus"), "--bogus"),
])
def test_bad_arguments_are_usage_errors(args, message):
    r = tool(*(str(own_library()) if a == "LIB" else a for a in args))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr, r.stderr


def test_a_cache_larger_than_the_machine_is_refused_by_name():
    r = tool(own_library(), "--hot", "--batch", "1024", "--tokens", str(1 << 24), "--rounds", "1")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "qkv_decode_ab: KVCache: cannot allocate the key pages" in r.stderr, r.stderr


def test_a_library_it_cannot_use(tmp_path):
    r = tool(tmp_path / "no-such-lib.so")
    assert r.returncode == 1 and "cannot load" in r.stderr and "no-such-lib.so" in r.stderr, r.stderr
    libm = next((p for p in (Path("/lib/x86_64-linux-gnu/libm.so.6"), Path("/lib/aarch64-linux-gnu/libm.so.6"),
                             Path("/usr/lib64/libm.so.6")) if p.exists()), None)
    if libm is None:
        pytest.skip("no libm.so.6 found to stand for a library without qkv")
    r = tool(libm)
    assert r.returncode == 1 and "has no qkv::decode_attention over a PagedKV" in r.stderr, r.stderr
