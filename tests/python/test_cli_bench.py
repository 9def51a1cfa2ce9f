"""`qkv bench`: the report's format (machine line, one row per available path, the automatic
path marked) and the refusal of bad input with a message and exit code 2."""
import json
import os
import re
import subprocess

import pytest

ROW = re.compile(r"^(avx512|avx2|scalar|reference)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+|-)(  <- automatic)?$")


def test_report_lists_every_path_with_figures(run):
    r = run("bench", "--shape", "1,2,65,33,40", "--causal", "--threads", "1", "--repeats", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "qkv bench: B=1 H=2 N=65 M=33 D=40 causal dtype f32 threads 1"
    assert re.match(r"machine: .+ family [0-9]+ model [0-9]+\): .+", lines[1]), lines[1]
    assert re.search(r"^  L3 .*cold-cache eviction and bandwidth buffer [0-9]+ MiB", r.stdout, re.M), r.stdout
    assert re.search(r"^ +1 +([0-9.]+ \( *[0-9.]+\)|-) ", r.stdout, re.M), r.stdout  # the 1-thread peaks row
    rows = [ROW.match(line) for line in lines if ROW.match(line)]
    names = [m.group(1) for m in rows]
    assert "scalar" in names and "reference" in names, r.stdout  # both always run; small shape
    for m in rows:
        assert float(m.group(2)) > 0 and float(m.group(3)) > 0, m.group(0)
    marked = [m.group(1) for m in rows if m.group(6)]
    auto = re.search(r"^automatic choice: fused (\w+)", r.stdout, re.M).group(1)
    assert marked == [auto], r.stdout


def test_tiny_figures_keep_their_digits(run):
    """A 1-token shape takes well under a microsecond: its time, GFLOP/s, GB/s and % peak once
    printed as 0.000, 0.0, 0.00 and 0.0."""
    r = run("bench", "--shape", "1,1,1,1,1", "--threads", "1", "--repeats", "1")
    assert r.returncode == 0, r.stderr
    rows = [ROW.match(line) for line in r.stdout.splitlines() if ROW.match(line)]
    assert rows, r.stdout
    for m in rows:
        figures = [m.group(i) for i in range(2, 6) if m.group(i) != "-"]
        assert all(float(x) > 0 for x in figures), m.group(0)


def test_a_large_shape_skips_the_slow_paths(run):
    """The scalar path runs at a few GFLOP/s: at 3.4e10 multiply-adds it would take minutes."""
    r = run("bench", "--shape", "1,1,16384,16384,64", "--threads", "1", "--repeats", "1", timeout=120)
    assert r.returncode == 0, r.stderr
    names = [ROW.match(line).group(1) for line in r.stdout.splitlines() if ROW.match(line)]
    assert "scalar" not in names and "reference" not in names and names, r.stdout
    assert "scalar: skipped (more than 1e+10 multiply-adds)" in r.stdout, r.stdout


def test_bf16_dtype_runs(run):
    r = run("bench", "--shape", "1,1,17,17,64", "--dtype", "bf16", "--threads", "2", "--repeats", "1")
    assert r.returncode == 0, r.stderr
    assert "dtype bf16 threads 2" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--shape", "1,2,3"], "expected B,H,N,M,D (5 values)"),
    (["--shape", "1,2,0,4,8"], "0 is outside 1 to 16777216"),
    (["--shape", "1,x,3,4,8"], "'x' is not an integer"),
    (["--shape", "64,64,65536,65536,128"], "--shape 64,64,65536,65536,128: needs 551 GB of tensors (at most 4 GB)"),
    # bf16 inputs keep their fp32 originals beside them: 3.3 GB in fp32 is 4.9 GB with bf16 copies.
    (["--shape", "1,1,16777216,16777216,12", "--dtype", "bf16"], "needs 4.9 GB of tensors (at most 4 GB)"),
    (["--shape", "1,1,010,1,1"], "--shape: '010' has a leading zero (not read as octal)"),
    (["--dtype", "f16"], "f16 not in"),
    (["--threads", "0"], "'0' is outside 1 to 4096"),
    (["--repeats", "0"], "'0' is outside 1 to 1000"),
    (["--repeats", "05"], "'05' has a leading zero"),
    (["--machine", "--repeats", "3"], "--machine excludes --repeats"),
    # Options the chosen mode would ignore.
    (["--json", "m.json"], "--json requires --machine"),
    (["--kv-dtype", "i8"], "--kv-dtype requires --decode"),
    (["--page-tokens", "16"], "--page-tokens requires --decode"),
    (["--decode", "1,2,1,64,64", "--machine"], "--decode excludes --machine"),
    (["--decode", "1,2,1,64,64", "--dtype", "bf16"], "--decode excludes --dtype"),
    (["--decode", "1,2,1,64,64", "--causal"], "--decode excludes --causal"),
    (["--machine", "--shape", "1,1,8,8,8"], "--shape excludes --machine"),
])
def test_bad_input_is_refused(run, args, message):
    r = run("bench", *args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("name, message", [("", "is a directory"), ("/", "the name ends in '/'"),
                                           ("missing/m.json", "does not exist")])
def test_unwritable_json_is_refused_before_the_probes(run, tmp_path, name, message):
    r = run("bench", "--machine", "--threads", "1", "--json", f"{tmp_path}/{name}" if name else tmp_path)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and "--json" in r.stderr and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_more_threads_than_cpus_is_refused(run):
    """128 threads on 2 CPUs once ran for minutes (the FMA-peak probe, time-sliced) before printing."""
    cpus = len(os.sched_getaffinity(0))
    r = run("bench", "--shape", "1,1,4,4,8", "--threads", cpus + 1, "--repeats", "1", timeout=30)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"--threads {cpus + 1}: this process may run on {cpus} CPU" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("how", ["QKV_NUM_THREADS", "OMP_NUM_THREADS", "affinity"])
def test_threads_past_the_cpus_this_process_may_use_are_refused(qkv_bin, how):
    """The count checked is the one the run would use: from the environment as from --threads,
    against the CPUs of the process's affinity (taskset, a cpuset), not the machine's."""
    cpus = len(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k not in ("QKV_NUM_THREADS", "OMP_NUM_THREADS")}
    argv = [qkv_bin, "bench", "--shape", "1,1,4,4,8", "--repeats", "1"]
    if how == "affinity":
        if cpus < 2:
            pytest.skip(f"needs 2 CPUs to pin to one (this process may use {cpus})")
        first = min(os.sched_getaffinity(0))
        argv = ["taskset", "-c", str(first)] + argv + ["--threads", "2"]
        expected = "--threads 2: this process may run on 1 CPU;"
    else:
        env[how] = str(cpus + 62)
        expected = f"the default thread count (QKV_NUM_THREADS, else OMP_NUM_THREADS or the CPUs) {cpus + 62}: "
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert expected in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_machine_json_agrees_with_itself(run, tmp_path):
    """`qkv bench --machine --json`: each summary is its own runs' (the probes' internal consistency;
    no speed is judged), and the eviction buffer is 2x the L3 found, at least 256 MiB."""
    path = tmp_path / "machine.json"
    r = run("bench", "--machine", "--json", str(path), "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert "read bandwidth, GB/s median" in r.stdout, r.stdout
    j = json.loads(path.read_text())
    assert j["class"] and j["eviction_bytes"] == max(2 * j["l3_bytes"], 256 << 20)
    assert j["simd"] in ("avx512", "avx2", "neon", "scalar"), j["simd"]
    [t] = j["threads"]
    assert t["threads"] == 1
    for name in ("fp32_avx512", "fp32_avx2", "bf16_dot"):
        p = t[name]
        if p["runs"]:
            assert len(p["runs"]) == 5 and p["best"] == max(p["runs"]) and min(p["runs"]) <= p["median"] <= p["best"]
    bw = t["bandwidth"]
    assert [s["streams"] for s in bw["by_streams"]] == [1, 2, 4, 8]
    for s in bw["by_streams"]:
        assert len(s["runs"]) == 11 and s["min"] == min(s["runs"]) and s["max"] == max(s["runs"])
        assert s["min"] <= s["median"] <= s["max"] and s["median"] == sorted(s["runs"])[5]
    assert bw["best"] == max(s["median"] for s in bw["by_streams"])
    assert bw["best_streams"] in (1, 2, 4, 8)


DECODE_ROW = re.compile(r"^(cold|hot)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+|-)$")
L3_NOTE = re.compile(r"^\(cold: a read of [0-9]+ MiB before each step, [0-9]+x the ([0-9]+) MiB L3;", re.M)


def decode_rows(stdout):
    return [DECODE_ROW.match(line) for line in stdout.splitlines() if DECODE_ROW.match(line)]


def test_decode_reports_the_bound_and_both_caches(run):
    r = run("bench", "--decode", "2,4,2,100,32", "--kv-dtype", "i8", "--page-tokens", "16", "--threads", "1",
            "--repeats", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "qkv bench --decode: B=2 H=4 Hkv=2 M=100 D=32 kv-dtype i8 threads 1"
    assert lines[1].startswith("machine: "), lines[1]
    # 2 sequences x 100 tokens x 2 KV heads x (2 x 32 int8 + 2 fp32 scales) = 28800 bytes, and the
    # page table the step reads too: 2 x 7 int32 entries and 2 int64 lengths, 28872 in all.
    decode = [line for line in lines if line.startswith("decode: ")]
    assert len(decode) == 1, r.stdout  # after the machine section
    assert re.match(r"decode: reads 0\.0289 MB \(K\+V and page table; i8 cache, pages of 16 tokens\), [0-9.e-]+ GFLOP; "
                    r"bound [0-9.]+ us \((read bandwidth|FMA peak)\)$", decode[0]), decode[0]
    rows = decode_rows(r.stdout)
    assert [m.group(1) for m in rows] == ["cold", "hot"], r.stdout
    assert re.search(r"^eviction check: ", r.stdout, re.M), r.stdout
    for m in rows:  # a step slowed 1000x by the scheduler still prints its digits (once "0.0")
        assert all(float(m.group(i)) > 0 for i in (2, 3)), m.group(0)
    assert float(rows[0].group(4)) > 0, rows[0].group(0)
    # 29 KB stay in any L3: the hot step reads them from cache, and its time over the memory's bound
    # (once printed as a % of a roofline it does not read at) is left out.
    if L3_NOTE.search(r.stdout):
        assert rows[1].group(4) == "-", r.stdout
        assert " hot: no %, as its bytes fit in half the L3" in r.stdout, r.stdout
        assert "eviction check: the cold step takes" in r.stdout, r.stdout


def test_a_hot_cache_past_half_the_l3_keeps_its_roofline(run):
    """A cache the size of the L3 streams from memory hot too: its hot row keeps its %."""
    r = run("bench", "--decode", "1,1,1,1,128", "--kv-dtype", "f32", "--threads", "1", "--repeats", "1")
    assert r.returncode == 0, r.stderr
    l3 = L3_NOTE.search(r.stdout)
    if not l3:
        pytest.skip("the L3 is unknown here")
    tokens = int(l3.group(1)) * 1024  # 1 KiB a token: 128 fp32 keys and values
    r = run("bench", "--decode", f"1,1,1,{tokens},128", "--kv-dtype", "f32", "--threads", "1", "--repeats", "1",
            timeout=120)
    assert r.returncode == 0, r.stderr
    rows = decode_rows(r.stdout)
    assert [m.group(1) for m in rows] == ["cold", "hot"] and all(float(m.group(4)) > 0 for m in rows), r.stdout
    assert "hot: no %" not in r.stdout and "(its bytes above half the L3: the hot step streams" in r.stdout, r.stdout


@pytest.mark.parametrize("args, message", [
    (["--decode", "1,4,3,64,32"], "H = 4 query heads is not a positive multiple of Hkv = 3"),
    (["--decode", "1,4,2"], "expected B,H,Hkv,M,D (5 values)"),
    (["--decode", "1,4,2,0,32"], "0 is outside 1 to 16777216"),
    (["--decode", "1,4,2,64,32", "--kv-dtype", "f8"], "dtype must be 'f32', 'bf16', 'f16' or 'i8', got 'f8'"),
    (["--decode", "1,4,2,64,32", "--page-tokens", "0"], "'0' is outside 1 to 16777216"),
    # The pool holds whole pages: 4.19 MB of tokens in pages of 256 tokens, one page per sequence.
    (["--decode", "16777216,1,1,1,1", "--page-tokens", "256"],
     "--decode 16777216,1,1,1,1 --page-tokens 256: the cache needs 17.3 GB in whole pages (at most 4 GB)"),
    (["--decode", "1,8,8,1,128", "--kv-dtype", "f32", "--page-tokens", "16777216"], "the cache needs 137 GB in whole"),
    (["--decode", "1,8,08,1,128"], "--decode: '08' has a leading zero"),
])
def test_bad_decode_input_is_refused(run, args, message):
    r = run("bench", *args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


def test_machine_json_names_the_kernels_path(qkv_bin, tmp_path):
    """`bench --machine` names the SIMD path the kernels run, QKV_SIMD honoured (bench/run.sh picks
    its overlap probe by it); scalar runs on every CPU."""
    path = tmp_path / "machine.json"
    env = dict(os.environ, QKV_SIMD="scalar")
    r = subprocess.run([qkv_bin, "bench", "--machine", "--json", str(path), "--threads", "1"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(path.read_text())["simd"] == "scalar"
    assert "the kernels' scalar path" in r.stdout.splitlines()[1], r.stdout


def test_bad_qkv_simd_stops_bench_before_the_probes(qkv_bin, tmp_path):
    """An invalid QKV_SIMD is refused by name, exit 1, with no probe run and no file written."""
    path = tmp_path / "machine.json"
    env = dict(os.environ, QKV_SIMD="avx9")
    r = subprocess.run([qkv_bin, "bench", "--machine", "--json", str(path), "--threads", "1"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "QKV_SIMD must be 'auto', 'avx512', 'avx2', 'neon' or 'scalar', got 'avx9'" in r.stderr, r.stderr
    assert r.stdout == "" and not path.exists(), r.stdout
