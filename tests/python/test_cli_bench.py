"""`qkv bench`: the report's format (machine line, one row per available path, the automatic
path marked) and the refusal of bad input with a message and exit code 2."""
import re

import pytest

ROW = re.compile(r"^(avx512|avx2|scalar|reference)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+|-)(  <- automatic)?$")


def test_report_lists_every_path_with_figures(run):
    r = run("bench", "--shape", "1,2,65,33,40", "--causal", "--threads", "1", "--repeats", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "qkv bench: B=1 H=2 N=65 M=33 D=40 causal dtype f32 threads 1"
    assert re.match(r"machine: fp32 FMA peak [0-9.]+ GFLOP/s \((AVX-512|AVX2), 1 threads\); read bandwidth [0-9.]+ GB/s",
                    lines[1]), lines[1]
    rows = [ROW.match(line) for line in lines if ROW.match(line)]
    names = [m.group(1) for m in rows]
    assert "scalar" in names and "reference" in names, r.stdout  # both always run; small shape
    for m in rows:
        assert float(m.group(2)) > 0 and float(m.group(3)) > 0, m.group(0)
    marked = [m.group(1) for m in rows if m.group(6)]
    auto = re.search(r"^automatic choice: fused (\w+)", r.stdout, re.M).group(1)
    assert marked == [auto], r.stdout


def test_bf16_dtype_runs(run):
    r = run("bench", "--shape", "1,1,17,17,64", "--dtype", "bf16", "--threads", "2", "--repeats", "1")
    assert r.returncode == 0, r.stderr
    assert "dtype bf16 threads 2" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--shape", "1,2,3"], "expected B,H,N,M,D (5 values)"),
    (["--shape", "1,2,0,4,8"], "0 is outside 1 to 16777216"),
    (["--shape", "1,x,3,4,8"], "'x' is not an integer"),
    (["--shape", "64,64,65536,65536,128"], "GB of tensors (at most 4)"),
    (["--dtype", "f16"], "f16 not in"),
    (["--threads", "0"], "'0' is outside 1 to 4096"),
    (["--repeats", "0"], "'0' is outside 1 to 1000"),
])
def test_bad_input_is_refused(run, args, message):
    r = run("bench", *args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
