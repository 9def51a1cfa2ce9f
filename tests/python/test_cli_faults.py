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
