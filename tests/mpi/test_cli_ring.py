"""`mpirun -np P qkv attend --ring`: the same output file as a single-process `qkv attend` (up to
rounding), for 2, 3 and 4 ranks; failures on one rank end every rank with a non-zero status and
a clear message, within a timeout, and leave no output file. Needs QKV_BIN (the qkv command)."""

import os
import signal
import subprocess
import time

import numpy as np
import pytest

QKV = os.environ.get("QKV_BIN", "qkv")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
TIMEOUT = 120


def seed():
    s = int(os.environ.get("QKV_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"QKV_TEST_SEED={s}")
    return s


def attend(tmp_path, ranks, extra, **arrays):
    paths = {}
    for name, a in arrays.items():
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], a)
    out = tmp_path / f"out{ranks}.npy"
    lse = tmp_path / f"lse{ranks}.npy"
    cmd = [QKV, "attend", "--q", str(paths["q"]), "--k", str(paths["k"]), "--v", str(paths["v"]),
           "--out", str(out), "--lse", str(lse)] + extra
    if ranks:
        cmd = MPIRUN + ["-np", str(ranks)] + cmd + ["--ring"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    return proc, out, lse


@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.parametrize("extra", [[], ["--causal"], ["--window", "5,2", "--key-lengths", "30,17"]],
                         ids=["plain", "causal", "window-lengths"])
def test_ring_file_matches_single_process(tmp_path, ranks, extra):
    rng = np.random.default_rng(seed())
    q = rng.standard_normal((2, 2, 37, 24), dtype=np.float32)
    k = rng.standard_normal((2, 1, 37, 24), dtype=np.float32)
    v = rng.standard_normal((2, 1, 37, 16), dtype=np.float32)
    single, out1, lse1 = attend(tmp_path, 0, extra, q=q, k=k, v=v)
    assert single.returncode == 0, single.stderr
    ring, out, lse = attend(tmp_path, ranks, extra, q=q, k=k, v=v)
    assert ring.returncode == 0, ring.stderr
    a, b = np.load(out), np.load(out1)
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    assert np.max(np.abs(a - b)) <= 2e-5 * (1 + np.max(np.abs(b)))
    la, lb = np.load(lse), np.load(lse1)
    assert np.array_equal(np.isinf(la), np.isinf(lb))
    fin = np.isfinite(lb)
    assert np.max(np.abs(la[fin] - lb[fin]), initial=0) <= 2e-5 * (1 + np.max(np.abs(lb[fin])))
    # The header is byte for byte what the single-process run writes.
    assert out.read_bytes()[:128] == out1.read_bytes()[:128]
    assert not list(tmp_path.glob(".*.tmp-*"))


def check_failure(proc, out, message):
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert not out.exists()
    assert not list(out.parent.glob(".*.tmp-*"))


def test_bad_value_in_one_ranks_shard_fails_every_rank(tmp_path):
    x = np.ones((1, 1, 40, 8), dtype=np.float32)
    q = x.copy()
    q[0, 0, 12, 3] = np.nan  # token 12 of 40 over 3 ranks (zigzag chunks of ~6.7) belongs to rank 1 only
    proc, out, _ = attend(tmp_path, 3, [], q=q, k=x, v=x)
    check_failure(proc, out, "rank 1: --q")
    # Ranks name the failing rank, not their own fault (mpirun may stop the others before they print).
    assert "qkv: error: rank 1: --q" in proc.stderr and "rank 0: --q" not in proc.stderr, proc.stderr


def test_a_fault_in_one_ranks_steps_fails_every_rank(tmp_path):
    """Finite inputs whose scores pass float32 in rank 1's rows only: the fault comes from the
    kernel mid-ring, after the ranks agreed on the call, and the others waited for rank 1 forever."""
    rng = np.random.default_rng(seed())
    q = rng.standard_normal((1, 1, 12, 8), dtype=np.float32)
    k = rng.standard_normal((1, 1, 12, 8), dtype=np.float32) * np.float32(1e19)
    v = rng.standard_normal((1, 1, 12, 8), dtype=np.float32)
    q[0, 0, 3:9] *= np.float32(1e20)  # zigzag over 2 ranks: chunks [3, 6) and [6, 9) are rank 1's
    start = time.monotonic()
    proc, out, _ = attend(tmp_path, 2, [], q=q, k=k, v=v)
    check_failure(proc, out, "qkv: error: rank 1: ring attention: the output overflowed float32")
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("shape, where", [((1, 2, 256, 8), (0, 1, 200, 3)), ((256, 8), (200, 3))], ids=["4d", "2d"])
def test_nan_is_named_by_its_place_in_the_file_once(tmp_path, ranks, shape, where):
    """The element a single-process run names ([0, 1, 200, 3]), not the rank's shard position
    ([0, 1, 72, 3]), and one line for every rank, not one per rank."""
    x = np.ones(shape, dtype=np.float32)
    q = x.copy()
    q[where] = np.nan
    single, out1, _ = attend(tmp_path, 0, [], q=q, k=x, v=x)
    element = f"element [{', '.join(map(str, where))}] is NaN"
    assert single.returncode != 0 and element in single.stderr, single.stderr
    proc, out, _ = attend(tmp_path, ranks, [], q=q, k=x, v=x)
    check_failure(proc, out, element)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("qkv: error:")]
    assert len(lines) == 1 and f"--q {tmp_path / 'q.npy'}: {element}" in lines[0], proc.stderr


def test_truncated_file_fails_every_rank(tmp_path):
    x = np.ones((1, 1, 40, 8), dtype=np.float32)
    proc, out, _ = attend(tmp_path, 2, [], q=x, k=x, v=x)
    assert proc.returncode == 0
    out.unlink()
    (tmp_path / "k.npy").write_bytes((tmp_path / "k.npy").read_bytes()[:-7])
    cmd = MPIRUN + ["-np", "2", QKV, "attend", "--ring", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"),
                    "--v", str(tmp_path / "v.npy"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    check_failure(proc, out, "rank 0: ")
    assert "k.npy" in proc.stderr


def test_mismatched_shapes_fail_every_rank(tmp_path):
    q = np.ones((1, 1, 40, 8), dtype=np.float32)
    v = np.ones((1, 1, 39, 8), dtype=np.float32)
    proc, out, _ = attend(tmp_path, 2, [], q=q, k=q, v=v)
    check_failure(proc, out, "must agree on [B, Hkv, M]")


def ranks_given(tmp_path, per_rank):
    """mpirun with one rank per argument list: `qkv attend --ring` given other files or outputs on
    each rank."""
    cmd = list(MPIRUN)
    for i, args in enumerate(per_rank):
        cmd += ([":"] if i else []) + ["-np", "1", QKV, "attend", "--ring"] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.parametrize("case", ["q rows", "k and v rows", "lse on rank 1 only", "lse on rank 0 only", "other out"])
def test_ranks_given_other_files_or_outputs_fail_every_rank(tmp_path, case):
    """Each rank reads its shard of the files it was given: of other shapes they would be pieces of
    other problems (once a silently wrong output, exit 0), and other outputs would make the ranks'
    collective writes differ (once a hang). Every rank ends, naming what differs; nothing is written."""
    arrays = {"q": (1, 1, 5, 8), "q6": (1, 1, 6, 8), "k": (1, 1, 7, 8), "k8": (1, 1, 8, 8)}
    for name, shape in arrays.items():
        np.save(tmp_path / f"{name}.npy", np.ones(shape, np.float32))
    f = {name: tmp_path / f"{name}.npy" for name in arrays}
    out = tmp_path / "out.npy"
    base = ["--q", f["q"], "--k", f["k"], "--v", f["k"], "--out", out]
    other, message = {
        "q rows": (["--q", f["q6"], "--k", f["k"], "--v", f["k"], "--out", out],
                   "rank 1: the shape of --q differs between ranks: rank 0 has [1, 1, 5, 8], this rank [1, 1, 6, 8]"),
        "k and v rows": (["--q", f["q"], "--k", f["k8"], "--v", f["k8"], "--out", out],
                         "rank 1: the shape of --k differs between ranks"),
        "lse on rank 1 only": (base + ["--lse", tmp_path / "lse.npy"],
                               f"rank 1: --lse differs between ranks: rank 0 has no --lse, this rank {tmp_path}/lse.npy"),
        "lse on rank 0 only": (base, f"rank 1: --lse differs between ranks: rank 0 has {tmp_path}/lse.npy, this rank "
                                     "no --lse"),
        "other out": (base[:-1] + [tmp_path / "out2.npy"], f"rank 1: --out differs between ranks: rank 0 has {out}"),
    }[case]
    first = base + ["--lse", tmp_path / "lse.npy"] if case == "lse on rank 0 only" else base
    proc = ranks_given(tmp_path, [first, other])
    check_failure(proc, out, message)
    assert not (tmp_path / "lse.npy").exists() and not (tmp_path / "out2.npy").exists()


def test_ring_refuses_float64(tmp_path):
    x = np.ones((1, 40, 8))
    proc, out, _ = attend(tmp_path, 2, [], q=x, k=x, v=x)
    check_failure(proc, out, "--ring reads C-order float32 .npy files, got '<f8'")


def test_ranks_with_no_tokens(tmp_path):
    # N = 3 queries and M = 5 keys over 4 ranks: zigzag leaves some ranks without tokens.
    rng = np.random.default_rng(seed())
    q = rng.standard_normal((3, 8), dtype=np.float32)
    k = rng.standard_normal((5, 8), dtype=np.float32)
    v = rng.standard_normal((5, 8), dtype=np.float32)
    extra = ["--causal=bottom_right"]
    single, out1, _ = attend(tmp_path, 0, extra, q=q, k=k, v=v)
    assert single.returncode == 0, single.stderr
    ring, out, _ = attend(tmp_path, 4, extra, q=q, k=k, v=v)
    assert ring.returncode == 0, ring.stderr
    a, b = np.load(out), np.load(out1)
    assert a.shape == b.shape == (3, 8)
    assert np.max(np.abs(a - b)) <= 2e-5 * (1 + np.max(np.abs(b)))


def cpu_seconds(pid):
    """User + system CPU time of a process (0 once it is gone)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rank_pids(mpirun_pid):
    """The pids of the ranks mpirun started (its children running qkv)."""
    out = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", str(mpirun_pid)], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if line.split()[1:] == ["qkv"]]


@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_rank_ends_every_rank_without_output(tmp_path, victim):
    """kill -9 of one rank mid-step: mpirun ends the others within a bound (no rank waits forever
    on its ring partner) and no output is left; a temporary file of a rank killed while writing is
    removed by the next write of that output."""
    rng = np.random.default_rng(seed())
    q = rng.standard_normal((1, 8, 8192, 64), dtype=np.float32)  # seconds of ring steps on 2 ranks
    for name in "qkv":
        np.save(tmp_path / f"{name}.npy", q)
    out = tmp_path / "out.npy"
    cmd = MPIRUN + ["-np", "2", QKV, "attend", "--ring", "--threads", "1", "--q", str(tmp_path / "q.npy"),
                    "--k", str(tmp_path / "k.npy"), "--v", str(tmp_path / "v.npy"), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        pids = []
        while len(pids) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            pids = sorted(rank_pids(proc.pid))
        assert len(pids) == 2, proc.communicate()
        # Inside the ring steps: both ranks past MPI_Init and the file reads, computing.
        while min(cpu_seconds(p) for p in pids) < 0.3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before a rank could be killed"
        os.kill(pids[victim], signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=60)
        waited = time.monotonic() - killed
    finally:
        proc.kill()
    print(f"rank {victim} killed: mpirun ended {waited:.2f} s later with status {proc.returncode}")
    assert proc.returncode != 0, err
    assert waited < 30, f"the other rank took {waited:.1f} s to end"
    assert not out.exists(), sorted(p.name for p in tmp_path.iterdir())
    small = tmp_path / "small.npy"
    np.save(small, q[:, :1, :16])
    again = subprocess.run([QKV, "attend", "--q", str(small), "--k", str(small), "--v", str(small), "--out", str(out)],
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.npy", "out.npy", "q.npy", "small.npy", "v.npy"]


@pytest.mark.parametrize("option, name", [("--out", "q.npy"), ("--lse", "v.npy"), ("--out", "bias.npy")])
def test_an_output_over_an_input_fails_every_rank_and_keeps_the_input(tmp_path, option, name):
    """As a single-process run: the output is refused before any rank reads, the input intact."""
    x = np.ones((1, 1, 40, 8), dtype=np.float32)
    for array, file in ((x, "q.npy"), (x, "k.npy"), (x, "v.npy"), (np.zeros((40, 40), np.float32), "bias.npy")):
        np.save(tmp_path / file, array)
    before = (tmp_path / name).read_bytes()
    outputs = {"--out": str(tmp_path / "out.npy"), "--lse": str(tmp_path / "lse.npy")}
    outputs[option] = str(tmp_path / name)
    cmd = MPIRUN + ["-np", "2", QKV, "attend", "--ring", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"),
                    "--v", str(tmp_path / "v.npy"), "--bias", str(tmp_path / "bias.npy"),
                    "--out", outputs["--out"], "--lse", outputs["--lse"]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode != 0, proc.stderr
    label = {"q.npy": "--q", "v.npy": "--v", "bias.npy": "--bias"}[name]
    assert f"{option} {tmp_path / name}: the same file as {label} " in proc.stderr, proc.stderr
    assert (tmp_path / name).read_bytes() == before
    assert not (tmp_path / "out.npy").exists() and not (tmp_path / "lse.npy").exists()
