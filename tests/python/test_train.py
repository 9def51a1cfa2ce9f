"""`qkv train`: a short run learns; SIGKILL + --resume gives bitwise the weights of an
uninterrupted run; corrupted, truncated or mismatched checkpoints are refused with one clear line
while the previous checkpoint survives; what a saved layer's note holds, and how it is printed."""

import os
import re
import signal
import subprocess
import time

import pytest

from qkv_testlib import masked_word_files

# A small task that trains in about a second: 4 pairs, 16 keys, 16 values (chance 6.25%).
SMALL = ["--task", "lookup", "-P", "4", "--keys", "16", "--values", "16", "-E", "32", "--heads", "2",
         "--batch", "32", "--lr", "0.01", "--eval-examples", "500"]


def accuracies(stdout):
    found = {name: float(value) / 100 for name, value in
             re.findall(r"^\s+(trained|parameter-free|untrained)\s+([0-9.]+)%$", stdout, re.M)}
    assert set(found) == {"trained", "parameter-free", "untrained"}, stdout
    return found


def test_short_run_learns(run, seed):
    r = run("train", *SMALL, "--steps", 800, "--seed", seed)
    note = f"seed {seed}: {r.stdout} {r.stderr}"
    assert r.returncode == 0, note
    acc = accuracies(r.stdout)
    assert acc["trained"] >= 0.9, note
    assert acc["trained"] >= acc["parameter-free"] + 0.4, note
    assert acc["untrained"] <= 0.3, note
    # stderr is not a terminal here: plain progress lines, no carriage returns.
    assert "\r" not in r.stderr and re.search(r"^step 800/800 +loss [0-9.]+ +acc", r.stderr, re.M), note
    assert re.search(r"^final training loss [0-9.]+; 800 steps in ", r.stdout, re.M), note


def test_divergence_fails_and_saves_nothing(run, seed, tmp_path):
    """A learning rate that blows the weights up ends with exit 1 naming the non-finite gradient; it
    once printed "final training loss -nan", exited 0 and wrote weights that load() refused."""
    out = tmp_path / "w.safetensors"
    args = [("1e30" if a == "0.01" else a) for a in SMALL]  # SMALL's --lr 0.01
    r = run("train", *args, "--steps", 5, "--seed", seed, "--save", out)
    assert r.returncode == 1, r.stdout + r.stderr
    # Whichever comes first: the optimizer's non-finite gradient, or the layer's overflowed forward
    # (which, after a step of training, names the rate instead of advising to scale the inputs down).
    assert ("non-finite value" in r.stderr or re.search(r"training step \d+: .*overflowed float32", r.stderr)) and \
        "lower the learning rate" in r.stderr, r.stderr
    assert not out.exists()


def test_checkpoint_loads_as_a_layer(run, seed, tmp_path):
    """layer.h promises that a training checkpoint loads as a layer; it once failed on its format."""
    import numpy as np
    import qkv
    ckpt, saved = tmp_path / "c.safetensors", tmp_path / "w.safetensors"
    r = run("train", *SMALL, "--steps", 20, "--seed", seed, "--checkpoint", ckpt, "--save", saved)
    assert r.returncode == 0, r.stderr
    from_ckpt, from_save = qkv.MultiHeadAttention.load(str(ckpt)), qkv.MultiHeadAttention.load(str(saved))
    for name in ("w_q", "w_k", "w_v", "w_o"):
        assert np.array_equal(getattr(from_ckpt, name), getattr(from_save, name)), name
    assert run("train", *SMALL, "--steps", 20, "--seed", seed, "--checkpoint", ckpt, "--resume").returncode == 0


def test_zero_steps_reports_no_loss(run, seed):
    """--steps 0 evaluates the layer as created; it once printed "final training loss 0.0000", a loss
    that was never measured."""
    r = run("train", *SMALL, "--steps", 0, "--seed", seed)
    assert r.returncode == 0, r.stderr
    assert "no training steps (--steps 0)" in r.stdout and "final training loss" not in r.stdout, r.stdout
    accuracies(r.stdout)


@pytest.mark.parametrize("warmup, note", [
    (100, "note: --warmup 100 is not below --steps 4: the learning rate rose over the whole run and reached 4% of "
          "--lr"),
    (4, "note: --warmup 4 is not below --steps 4: the learning rate rose over the whole run and reached 100% of --lr"),
    (3, None)])
def test_a_run_inside_its_warmup_says_so(run, seed, warmup, note):
    """--steps alone shortens a run below the default warm-up of 100 steps, whose learning rate
    then never reaches --lr (LrSchedule): the last lines say how far it got."""
    r = run("train", *SMALL, "--steps", 4, "--warmup", warmup, "--seed", seed)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    if note is None:
        assert lines[-1].startswith("final training loss") and "warmup" not in r.stdout, r.stdout
    else:
        assert lines[-2].startswith("final training loss") and lines[-1] == note, r.stdout


def test_held_out_examples_take_one_batch_of_memory(qkv_bin):
    """The held-out set was built whole before training: 2.3 GB at --eval-examples 1000000 (of the
    10,000,000 allowed). It is drawn again batch by batch: SMALL's 200,000 examples peak at 14 MB
    resident (one thread) and run in 100 MB of address space, where the whole set took 140 MB
    resident. (A child's peak resident size counts its parent's at the fork, so the test caps the
    address space instead.)"""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (100 << 20, 100 << 20))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    args = [("200000" if a == "500" else a) for a in SMALL]  # SMALL's --eval-examples 500
    r = subprocess.run([qkv_bin, "train", *args, "--steps", "0", "--threads", "1"],
                       capture_output=True, text=True, env=env, preexec_fn=cap, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "held-out accuracy (200000 examples" in r.stdout, r.stdout


def test_zero_steps_still_write_the_checkpoint_asked_for(run, seed, tmp_path):
    """--checkpoint with --steps 0 wrote nothing, and a later --resume said the file did not exist."""
    ckpt = tmp_path / "c.safetensors"
    r = run("train", *SMALL, "--steps", 0, "--seed", seed, "--checkpoint", ckpt)
    assert r.returncode == 0 and ckpt.exists(), r.stderr
    r = run("train", *SMALL, "--steps", 0, "--seed", seed, "--checkpoint", ckpt, "--resume")
    assert r.returncode == 0, r.stdout + r.stderr


def test_sigkill_then_resume_is_bitwise_identical(run, qkv_bin, seed, tmp_path):
    steps = 4000
    args = [*SMALL, "--steps", str(steps), "--seed", str(seed)]
    straight = run("train", *args, "--save", tmp_path / "straight.safetensors", timeout=300)
    assert straight.returncode == 0, f"seed {seed}: {straight.stderr}"

    ckpt = tmp_path / "ckpt.safetensors"
    cmd = [qkv_bin, "train", *args, "--checkpoint", str(ckpt), "--checkpoint-every", "100"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not os.path.exists(str(ckpt) + ".prev") and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
    still_running = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert still_running, f"seed {seed}: the run ended before it could be killed"
    assert ckpt.exists(), f"seed {seed}: no checkpoint written before the kill"

    resumed = run("train", *args, "--checkpoint", ckpt, "--checkpoint-every", 100, "--resume",
                  "--save", tmp_path / "resumed.safetensors", timeout=300)
    assert resumed.returncode == 0, f"seed {seed}: {resumed.stderr}"
    m = re.search(r"resumed from step (\d+) of (\d+)", resumed.stdout)
    assert m and 0 < int(m.group(1)) < steps, f"seed {seed}: {resumed.stdout}"
    a = (tmp_path / "straight.safetensors").read_bytes()
    b = (tmp_path / "resumed.safetensors").read_bytes()
    assert a == b, f"seed {seed}: weights after resume (from step {m.group(1)}) differ from the uninterrupted run"
    assert accuracies(straight.stdout)["trained"] == accuracies(resumed.stdout)["trained"], f"seed {seed}"


def flip_byte(path, offset_from_end):
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x40
    path.write_bytes(bytes(data))


def test_bad_checkpoints_are_refused_and_previous_survives(run, seed, tmp_path):
    ckpt = tmp_path / "ckpt.safetensors"
    prev = tmp_path / "ckpt.safetensors.prev"
    args = [*SMALL, "--steps", "300", "--seed", str(seed), "--checkpoint", str(ckpt), "--checkpoint-every", "100"]
    first = run("train", *args)
    assert first.returncode == 0, f"seed {seed}: {first.stderr}"
    assert ckpt.exists() and prev.exists(), f"seed {seed}"
    good_prev = prev.read_bytes()

    flip_byte(ckpt, 3)  # inside the last tensor's data
    r = run("train", *args, "--resume")
    assert r.returncode == 1, f"seed {seed}: {r.stdout} {r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is corrupted: checksum" in lines[0], r.stderr
    assert f"the previous checkpoint {prev} is still there" in lines[0], r.stderr
    assert prev.read_bytes() == good_prev

    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    r = run("train", *args, "--resume")
    assert r.returncode == 1 and f"checkpoint {ckpt} is unreadable" in r.stderr, r.stderr
    assert prev.read_bytes() == good_prev

    # The previous checkpoint is intact and resumes (it holds step 200 of 300).
    r = run("train", *[a if a != str(ckpt) else str(prev) for a in args], "--resume")
    assert r.returncode == 0, r.stderr
    assert "resumed from step 200 of 300" in r.stdout, r.stdout


def test_resume_refuses_other_settings_and_missing_files(run, seed, tmp_path):
    ckpt = tmp_path / "ckpt.safetensors"
    base = [*SMALL, "--steps", "100", "--seed", str(seed), "--checkpoint", str(ckpt)]
    assert run("train", *base).returncode == 0
    r = run("train", *[("5" if a == "4" else a) for a in base], "--resume")  # -P 5
    assert r.returncode == 1 and "was written with pairs=4 but this run has pairs=5" in r.stderr, r.stderr
    r = run("train", *SMALL, "--steps", "100", "--checkpoint", tmp_path / "none.safetensors", "--resume")
    assert r.returncode == 1 and "none.safetensors is unreadable" in r.stderr, r.stderr
    r = run("train", *SMALL, "--resume")
    assert r.returncode == 2 and "--resume needs --checkpoint" in r.stderr, r.stderr
    r = run("train", *[("20" if a == "4" else a) for a in SMALL])  # -P 20 with 16 keys
    assert r.returncode == 2 and "--keys (16) must be at least --pairs (20)" in r.stderr, r.stderr


def test_a_file_name_that_is_not_utf8_is_kept_in_the_note_as_text(qkv_bin, tmp_path):
    """The layer's note names its files and is saved as JSON text: a --sentences name with a byte
    that is not UTF-8 failed the save after every step had run."""
    words, sentences = masked_word_files(tmp_path, b"sent\xff.txt")
    out = tmp_path / "w.safetensors"
    r = subprocess.run([qkv_bin, b"train", b"--task", b"masked-word", b"--embeddings", os.fsencode(words),
                        b"--sentences", sentences, b"--steps", b"3", b"--eval-examples", b"20", b"--save",
                        os.fsencode(out)], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    import qkv
    assert "on sent\ufffd.txt" in qkv.MultiHeadAttention.load(str(out)).note


def test_a_layer_files_note_reaches_the_terminal_without_its_control_characters(run, tmp_path):
    """A layer file's note is the file's text: its escape sequences and bells were printed raw."""
    import numpy as np
    from qkv_testlib import write_layer
    words, _ = masked_word_files(tmp_path)
    layer = tmp_path / "noted.safetensors"
    write_layer(layer, np.random.default_rng(0), 64, 2, 32, note="evil \x1b[31mRED\x1b[0m \x07bell \u009b2J")
    r = run("explain", "--weights", layer, "--embeddings", words, "w1 w2 w3")
    assert r.returncode == 0, r.stderr
    line = next(line for line in r.stdout.splitlines() if "noted.safetensors" in line)
    assert line.endswith(": evil  [31mRED [0m  bell  2J"), line


@pytest.mark.parametrize("task", ["lookup", "masked-word"])
def test_weights_are_bitwise_the_same_for_any_thread_count(qkv_bin, seed, tmp_path, task):
    """The weights depend on the seed alone: OpenBLAS's products once ran on --threads threads (and
    on OPENBLAS_NUM_THREADS's), and their bits (so every weight after a step) changed with the count."""
    if task == "lookup":
        args = [*SMALL, "--steps", 30]
        args[args.index("--batch") + 1] = "256"
    else:
        words, sentences = masked_word_files(tmp_path)
        args = ["--task", "masked-word", "--embeddings", words, "--sentences", sentences, "--batch", "256",
                "--steps", 30, "--eval-examples", 50]
    saved = []
    for threads, blas_threads in ((1, "2"), (2, "1"), (3, None)):
        out = tmp_path / f"w{threads}.safetensors"
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
        if blas_threads:
            env["OPENBLAS_NUM_THREADS"] = blas_threads
        r = subprocess.run([qkv_bin, "train", *map(str, args), "--seed", str(seed), "--threads", str(threads), "--save",
                            str(out)], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        saved.append(out.read_bytes())
    assert saved[0] == saved[1] == saved[2], f"seed {seed}"
