"""Faults around the `qkv` command: kill -9 at any moment leaves no temporary file behind for good,
Ctrl-C during `qkv train` names the last checkpoint, a mistyped option finds its spelling, and a
full disk keeps the old output, checkpoint or vectors whole."""

import json
import os
import random
import re
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

# A small lookup task (test_train.py's) at a width whose checkpoint takes a moment to write.
TRAIN = ["train", "--task", "lookup", "-P", "4", "--keys", "16", "--values", "16", "-E", "128", "--heads", "2",
         "--batch", "32", "--lr", "0.01", "--eval-examples", "100"]


def temporaries(directory):
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


def checkpoint_step(path):
    """train.step from a checkpoint's safetensors metadata."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    return int(json.loads(data[8:8 + size])["__metadata__"]["train.step"])


def wait_for(path, proc, seconds=60):
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.002)
    return path.exists()


def test_sigkill_at_many_moments_leaves_no_stale_temporary(qkv_bin, run, seed, tmp_path):
    """kill -9 while a checkpoint is written leaves its temporary file (.NAME.tmp-PID-...); the next
    write of that checkpoint removes every temporary whose writer is dead. Kills land at random
    moments until several left one behind (each run writes a checkpoint after every step)."""
    rnd = random.Random(seed)
    ckpt = tmp_path / "ckpt.safetensors"
    args = [qkv_bin, *TRAIN, "--steps", "1000000", "--seed", str(seed), "--checkpoint", str(ckpt),
            "--checkpoint-every", "1"]
    left, kills = set(), 0
    while len(left) < 3 and kills < 60:
        if ckpt.exists():
            ckpt.unlink()
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert wait_for(ckpt, proc), f"seed {seed}: no checkpoint written"
            time.sleep(rnd.uniform(0, 0.05))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        kills += 1
        now = set(temporaries(tmp_path))
        assert not (left & now), f"seed {seed}: temporaries of killed runs outlived the next write: {left & now}"
        left |= now
    print(f"seed {seed}: {kills} kills left {len(left)} temporaries: {sorted(left)}")
    assert left, f"seed {seed}: no kill in {kills} hit a checkpoint write; nothing was tested"

    r = run(*TRAIN, "--steps", 2, "--seed", seed, "--checkpoint", ckpt, "--checkpoint-every", 1)
    assert r.returncode == 0, r.stderr
    assert temporaries(tmp_path) == [], f"seed {seed}: {temporaries(tmp_path)}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.safetensors", "ckpt.safetensors.prev"]


def interrupt_train(qkv_bin, tmp_path, extra, wait_path=None, delay=0.3):
    proc = subprocess.Popen([qkv_bin, *TRAIN, "--steps", "1000000", *map(str, extra)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        if wait_path is not None:
            assert wait_for(wait_path, proc), proc.stderr.read()
        time.sleep(delay)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc.returncode, out, err


def test_ctrl_c_names_the_last_checkpoint(qkv_bin, run, seed, tmp_path):
    ckpt = tmp_path / "ckpt.safetensors"
    code, _, err = interrupt_train(qkv_bin, tmp_path, ["--seed", seed, "--checkpoint", ckpt,
                                                       "--checkpoint-every", 7], wait_path=ckpt)
    last = err.strip().splitlines()[-1]
    assert code == 130, err
    m = re.fullmatch(r"qkv: train interrupted after step (\d+) of 1000000; the checkpoint (\S+) holds step (\d+): "
                     r"add --resume to go on from there", last)
    assert m, err
    done, saved = int(m.group(1)), int(m.group(3))
    assert m.group(2) == str(ckpt) and saved == done // 7 * 7 and saved > 0, last
    assert checkpoint_step(ckpt) == saved, last
    assert temporaries(tmp_path) == []

    # --resume continues from it; interrupted again, the line counts from the resumed step.
    code, out, err = interrupt_after_a_step(qkv_bin, tmp_path, ["--seed", seed, "--checkpoint", ckpt,
                                                                "--checkpoint-every", 1000000, "--resume"])
    assert code == 130, err
    assert f"the checkpoint {ckpt} holds step {saved}: add --resume" in err, err


def interrupt_after_a_step(qkv_bin, tmp_path, extra):
    """interrupt_train, waiting longer while the setup (data, untrained accuracy) outlasts the delay."""
    for delay in (0.5, 2, 6):
        code, out, err = interrupt_train(qkv_bin, tmp_path, extra, delay=delay)
        if "before the first step" not in err:
            break
    return code, out, err


def test_ctrl_c_without_a_checkpoint_says_nothing_was_saved(qkv_bin, seed, tmp_path):
    code, _, err = interrupt_after_a_step(qkv_bin, tmp_path, ["--seed", seed])
    assert code == 130, err
    assert re.fullmatch(r"qkv: train interrupted after step \d+ of 1000000; nothing was saved", err.strip()), err

    ckpt = tmp_path / "late.safetensors"
    code, _, err = interrupt_after_a_step(qkv_bin, tmp_path, ["--seed", seed, "--checkpoint", ckpt,
                                                              "--checkpoint-every", 900000])
    assert code == 130, err
    assert err.strip().endswith("; no checkpoint was written yet (the first is due after step 900000)"), err
    assert not ckpt.exists()


def test_unknown_option_finds_the_other_spelling(run):
    """The CLI and the Python API share one rule: PyTorch's is_causal and key_lengths with '_' find
    --causal and --key-lengths."""
    for typed, best in [("--is-causal", "--causal"), ("--key_lengths", "--key-lengths"), ("--head", "--heads")]:
        r = run("explain" if typed == "--head" else "attend", typed, "x")
        assert r.returncode == 2, r.stderr
        assert f"qkv: unknown option {typed} (did you mean {best}?)" in r.stderr, r.stderr


# ---- a full disk: a small tmpfs, mounted when the tests run as root ----

@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs ({r.stderr.strip() or r.returncode}); the full-disk tests need root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(directory, leave):
    """Fills the file system of `directory` until about `leave` bytes are free."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    (directory / "filler").write_bytes(b"\0" * max(0, free - leave))


def check_full_disk(r, old, old_bytes):
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"cannot write {old}" in r.stderr and "No space left on device" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert old.read_bytes() == old_bytes
    assert temporaries(old.parent) == [], temporaries(old.parent)


def test_full_disk_keeps_the_old_output(run, small_disk, tmp_path):
    x = np.ones((1, 1, 1024, 8), np.float32)  # out: 32 KiB
    for name in "qkv":
        np.save(tmp_path / f"{name}.npy", x)
    out = small_disk / "out.npy"
    out.write_bytes(b"old output")
    fill(small_disk, 8192)
    r = run("attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy", "--out", out)
    check_full_disk(r, out, b"old output")


def test_full_disk_keeps_the_old_checkpoint(run, seed, small_disk):
    ckpt = small_disk / "ckpt.safetensors"
    ckpt.write_bytes(b"old checkpoint")
    fill(small_disk, 8192)
    r = run(*TRAIN, "--steps", 3, "--seed", seed, "--checkpoint", ckpt, "--checkpoint-every", 1)
    check_full_disk(r, ckpt, b"old checkpoint")
    # The previous copy (a hard link, no space) may stay; no temporary does.
    assert sorted(p.name for p in small_disk.iterdir()) in (
        ["ckpt.safetensors", "filler"], ["ckpt.safetensors", "ckpt.safetensors.prev", "filler"])


def test_full_disk_keeps_the_old_word_vectors(run, embeddings, small_disk):
    out = small_disk / "vectors.json"
    out.write_bytes(b"old vectors")
    fill(small_disk, 4096)
    sentence = " ".join(embeddings.words * 8)
    r = run("context", sentence, "--embeddings", embeddings.glove, "--parameter-free", "--format", "json", "--out", out)
    check_full_disk(r, out, b"old vectors")


def _attend_files(directory, n, m, d=4, seed=0):
    rng = np.random.default_rng(seed)
    for name, rows in (("q", n), ("k", m), ("v", m)):
        np.save(directory / f"{name}.npy", rng.standard_normal((rows, d)).astype(np.float32))
    return ["attend", "--q", directory / "q.npy", "--k", directory / "k.npy", "--v", directory / "v.npy"]


def test_a_later_output_failing_keeps_every_earlier_one(run, small_disk, tmp_path):
    """Three outputs, the last too large for the disk: the two before it were already renamed over
    the user's files and then removed, losing them. Every output is now written before any
    replaces its file."""
    for name in ("o.npy", "l.npy"):
        (small_disk / name).write_bytes(b"OLD " + name.encode())
    r = run(*_attend_files(tmp_path, 100, 200), "--out", small_disk / "o.npy", "--lse", small_disk / "l.npy",
            "--weights", small_disk / "w.npy")  # weights: 80 KB on a 64 KB disk
    assert r.returncode == 1 and r.stderr.count("\n") == 1, (r.returncode, r.stderr)
    assert f"cannot write {small_disk / 'w.npy'}: No space left on device" in r.stderr, r.stderr
    assert sorted(p.name for p in small_disk.iterdir()) == ["l.npy", "o.npy"]
    assert [(small_disk / n).read_bytes() for n in ("o.npy", "l.npy")] == [b"OLD o.npy", b"OLD l.npy"]


def test_a_file_size_limit_fails_the_write_with_one_line(qkv_bin, tmp_path):
    """`ulimit -f` sends SIGXFSZ past the limit: the process died (exit 153) beside a temporary
    file and the outputs written before. The write now fails with EFBIG."""
    import resource
    argv = [qkv_bin, *map(str, _attend_files(tmp_path, 1024, 1024)), "--out", tmp_path / "o.npy", "--weights",
            tmp_path / "w.npy"]  # weights: 4 MB
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))  # noqa: E731
    r = subprocess.run(list(map(str, argv)), capture_output=True, text=True, preexec_fn=limit, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, (r.returncode, r.stderr)
    assert f"cannot write {tmp_path / 'w.npy'}: File too large" in r.stderr, r.stderr
    assert not (tmp_path / "o.npy").exists() and not (tmp_path / "w.npy").exists() and temporaries(tmp_path) == []


@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_a_lost_stderr_keeps_the_exit_status(qkv_bin, tmp_path, stderr):
    """A message that cannot reach stderr aborted the process (fmt threw inside main's catch):
    exit 134 for a failure, and for a training run that had succeeded."""
    def start():
        if stderr == "closed":
            os.close(2)
        else:
            os.dup2(os.open("/dev/full", os.O_WRONLY), 2)
    failing = [qkv_bin, "attend", "--q", tmp_path / "none.npy", "--k", tmp_path / "k", "--v", tmp_path / "v", "--out",
               tmp_path / "o.npy"]
    r = subprocess.run(list(map(str, failing)), capture_output=False, stdout=subprocess.DEVNULL, preexec_fn=start,
                       timeout=60)
    assert r.returncode == 1
    save = tmp_path / "s.safetensors"
    training = [qkv_bin, *TRAIN, "--steps", "3", "--save", save]
    r = subprocess.run(list(map(str, training)), stdout=subprocess.DEVNULL, preexec_fn=start, timeout=60)
    assert r.returncode == 0 and save.exists()


@pytest.mark.parametrize("stdout", ["closed", "full"])
def test_a_lost_stdout_fails_the_run(qkv_bin, tmp_path, stdout):
    """`qkv train >/dev/full` exited 0 with its whole report lost; with stdout closed, a file qkv
    opened could take descriptor 1 and receive what it prints."""
    def start():
        if stdout == "closed":
            os.close(1)
        else:
            os.dup2(os.open("/dev/full", os.O_WRONLY), 1)
    r = subprocess.run([qkv_bin, *TRAIN, "--steps", "2"], stderr=subprocess.PIPE, text=True, preexec_fn=start,
                       timeout=60)
    expected = ("standard output is closed: qkv prints its results there" if stdout == "closed"
                else "cannot write to standard output: No space left on device")
    assert r.returncode == 1 and expected in r.stderr.splitlines()[-1], (r.returncode, r.stderr)


def test_sigterm_at_any_moment_leaves_every_output_old_or_new(qkv_bin, seed, tmp_path):
    """SIGTERM, SIGHUP and Ctrl-C outside `train` ended the process by default: 13 of 15 kills
    during the writes left the first outputs replaced and a 150 MB temporary file. The handler
    removes the temporary files, and no output replaces its file before all are written."""
    rnd = random.Random(seed)
    argv = list(map(str, _attend_files(tmp_path, 3072, 3072, d=16)))  # weights: 38 MB
    outputs = [tmp_path / n for n in ("o.npy", "l.npy", "w.npy")]
    argv = [qkv_bin, *argv, "--out", str(outputs[0]), "--lse", str(outputs[1]), "--weights", str(outputs[2]),
            "--threads", "1"]
    assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0
    new = [p.read_bytes() for p in outputs]
    start = time.monotonic()
    assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0
    seconds = time.monotonic() - start
    seen = set()
    for kill in range(8):
        for p in outputs:
            p.write_bytes(b"old")
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(rnd.uniform(0.3, 1.1) * seconds)
        proc.send_signal(rnd.choice([signal.SIGTERM, signal.SIGHUP, signal.SIGINT]))
        status = proc.wait(timeout=120)
        got = [p.read_bytes() for p in outputs]
        assert got in ([b"old"] * 3, new), f"seed {seed} kill {kill}: a mix of old and new outputs"
        assert temporaries(tmp_path) == [], f"seed {seed} kill {kill}: {temporaries(tmp_path)}"
        seen.add("killed" if status < 0 else "finished")
    print(f"seed {seed}: {sorted(seen)} over 8 kills in a run of {seconds:.2f} s")


def test_sigbus_ends_with_one_line(qkv_bin, tmp_path):
    """A mapped input truncated by another program while it is read raises SIGBUS, which dumped
    core (exit 135) without a word. Sent here by hand, the moment a truncation hits being chance."""
    argv = [qkv_bin, *map(str, _attend_files(tmp_path, 4096, 4096, d=32)), "--out", str(tmp_path / "o.npy"),
            "--threads", "1", "--kernel", "reference"]  # seconds: the signal lands mid-run
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.2)
    proc.send_signal(signal.SIGBUS)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (proc.returncode, err)
    assert err == ("qkv: error: a file qkv maps (an input) became shorter while it was read (SIGBUS): another "
                   "program truncated or rewrote it\n"), err
    assert temporaries(tmp_path) == []


def test_a_huge_openmp_thread_count_is_capped_when_reading_word_vectors(qkv_bin, tmp_path):
    """OMP_NUM_THREADS=100000 crashed the word-vector reader (SIGSEGV), the one loop whose threads
    were not capped as the kernels' are."""
    words = tmp_path / "words.txt"
    words.write_text("".join(f"w{i} {i % 7 / 7:.3f} {i % 5 / 5:.3f} 0.5 -0.25\n" for i in range(5000)))
    env = dict(os.environ, OMP_NUM_THREADS="100000")
    env.pop("QKV_NUM_THREADS", None)
    r = subprocess.run([qkv_bin, "context", "--embeddings", str(words), "--parameter-free", "w1 w2 w3"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-500:])


@pytest.mark.parametrize("value", ["abc", "0", "-1", "99999999", " 4", "2x"])
def test_an_unusable_thread_count_in_the_environment_is_named(qkv_bin, value):
    """QKV_NUM_THREADS that the library cannot use was ignored without a word (QKV_SIMD's is refused)."""
    r = subprocess.run([qkv_bin, "explain"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, QKV_NUM_THREADS=value))
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr == f"qkv: QKV_NUM_THREADS={value}: expected a decimal integer from 1 to 4096\n", r.stderr


def test_a_curve_failing_after_the_save_says_the_layer_is_kept(run, seed, small_disk, tmp_path):
    """The loss curve is written after the run saved its layer: the one line says where it is."""
    fill(small_disk, 0)
    save = tmp_path / "layer.safetensors"
    r = run(*TRAIN, "--steps", 2, "--seed", seed, "--save", save, "--loss-csv", small_disk / "loss.csv")
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last == (f"qkv: error: cannot write {small_disk / 'loss.csv'}: No space left on device (the trained layer "
                    f"is saved in {save})"), last
    assert save.exists() and temporaries(small_disk) == []


def test_a_checkpoint_whose_previous_cannot_be_kept_is_refused_before_step_1(qkv_bin, run, tmp_path):
    """The previous checkpoint is kept as <ckpt>.prev: a directory there failed the run at its second
    checkpoint, after the steps before it had run. It is refused before the first step now."""
    ckpt = tmp_path / "ckpt.safetensors"
    (tmp_path / "ckpt.safetensors.prev").mkdir()
    for existing in (False, True):
        if existing:
            ckpt.write_bytes(b"an earlier run's checkpoint")
        r = run(*TRAIN, "--steps", 1000000, "--checkpoint", ckpt, "--checkpoint-every", 1, timeout=60)
        assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
        assert r.stderr == (f"qkv: error: checkpoint {ckpt}: the previous one cannot be kept as {ckpt}.prev: it is a "
                            f"directory (remove or rename it)\n"), r.stderr
        assert ckpt.exists() == existing and temporaries(tmp_path) == []
    # A directory that cannot be written was already refused before the first step, by the output rule.
    r = run(*TRAIN, "--steps", 1000000, "--checkpoint", tmp_path / "missing" / "ckpt", timeout=60)
    assert r.returncode == 1 and r.stderr.startswith(f"qkv: error: --checkpoint {tmp_path / 'missing' / 'ckpt'}: "), \
        r.stderr


def _memory_hint(batch, pairs, embed_dim, values):
    return re.escape(f"for less memory, try a smaller --batch ({batch}), fewer --pairs ({pairs}), a narrower "
                     f"--embed-dim ({embed_dim}) or fewer --values ({values})")


def test_training_out_of_memory_says_where_what_is_kept_and_which_options_need_less(qkv_bin, tmp_path):
    """Out of memory in `qkv train` printed `out of memory` alone (an allocation qkv did not name,
    such as the word vectors' words), or an allocation's name with no hint of what to change. One
    line now: where the run stopped, the allocation (named when qkv made it), what was kept and the
    options that size the run's memory."""
    import resource
    # Weights of 8192 x 8192 floats (256 MiB each) in 600 MiB: the layer cannot be made.
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (600 << 20, resource.RLIM_INFINITY))  # noqa: E731
    r = subprocess.run([qkv_bin, "train", "--task", "lookup", "-P", "2", "--keys", "16", "--values", "16", "-E", "8192",
                        "--heads", "2", "--batch", "4", "--threads", "1", "--steps", "3"],
                       capture_output=True, text=True, preexec_fn=limit, timeout=120)
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stderr)
    assert re.fullmatch(r"qkv: error: training ran out of memory before the first step: w_\w: cannot allocate "
                        r"268435456 bytes \(out of memory\); nothing was saved; " + _memory_hint(4, 2, 8192, 16) + "\n",
                        r.stderr), r.stderr

    # Memory running out after some steps (the limit lowered under the running process, whose
    # tensors of 36 MB are mapped and unmapped at every step): the line names the last step done
    # and the checkpoint that holds the run.
    ckpt = tmp_path / "ckpt.safetensors"
    proc = subprocess.Popen([qkv_bin, "train", "--task", "lookup", "-P", "8", "--keys", "16", "--values", "16", "-E",
                             "1024", "--heads", "2", "--batch", "512", "--threads", "1", "--eval-examples", "100",
                             "--steps", "1000000", "--checkpoint", ckpt, "--checkpoint-every", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(ckpt, proc), proc.communicate()
        with open(f"/proc/{proc.pid}/status") as status:
            mapped = next(int(line.split()[1]) << 10 for line in status if line.startswith("VmSize:"))
        resource.prlimit(proc.pid, resource.RLIMIT_AS, (mapped - (200 << 20), resource.RLIM_INFINITY))
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1 and err.count("\n") == 1, (proc.returncode, err)
    m = re.fullmatch(r"qkv: error: training ran out of memory after step (\d+) of 1000000: .*: cannot allocate \d+ "
                     r"bytes \(out of memory\); the checkpoint (.*) holds step (\d+): add --resume to go on from "
                     r"there; " + _memory_hint(512, 8, 1024, 16) + "\n", err)
    assert m and m.group(2) == str(ckpt), err
    assert int(m.group(3)) == checkpoint_step(ckpt) <= int(m.group(1)), err
