"""Tight memory and long input through the `qkv` command: every command starts and ends in a 100 MB
address space (OpenBLAS's thread pool used to hang it at start-up), a thread count asked for in a
small address space is cut to what fits (here and in the Python module), and sentences come from a
file or standard input as well as from the command line."""
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest

LIMIT = 100 << 20  # `ulimit -v 100M`


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def run_capped(qkv_bin, *args, timeout=60):
    return subprocess.run([qkv_bin, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_capped)


def test_help_of_every_command_starts_in_100mb(qkv_bin):
    for args in ([], ["--help"], ["explain", "--help"], ["context", "--help"], ["compare", "--help"],
                 ["attend", "--help"], ["train", "--help"]):
        proc = run_capped(qkv_bin, *args, timeout=20)  # hung forever before the fix
        assert proc.returncode in (0, 2), (args, proc.stderr)


def test_every_command_runs_or_fails_with_one_line_in_100mb(qkv_bin, tmp_path, embeddings, seed):
    rng = np.random.default_rng(seed)
    for name, shape in (("q", (2, 5, 8)), ("k", (2, 7, 8)), ("v", (2, 7, 8))):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(shape).astype(np.float32))
    small = [
        ["explain"],
        ["explain", "--embeddings", embeddings.glove, "--random-weights", "0", "the river bank", "--html",
         tmp_path / "e.html"],
        ["context", "--embeddings", embeddings.glove, "--heads", "2", "the river bank"],
        ["compare", "--embeddings", embeddings.glove, "--random-weights", "0", "--word", "bank", "the river bank", "the bank"],
        ["attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
         "--out", tmp_path / "o.npy"],
        ["train", "--steps", "2", "--batch", "2", "--pairs", "2", "--keys", "4", "--values", "4", "-E", "8",
         "--eval-examples", "4", "--threads", "2"],
    ]
    for args in small:
        proc = run_capped(qkv_bin, *args)
        assert proc.returncode == 0, (args, proc.stderr)
    # Too big for 100 MB: one clear line, exit 1.
    proc = run_capped(qkv_bin, "train", "--steps", "1", "--batch", "4096", "--pairs", "64", "--keys", "64",
                      "--values", "64", "-E", "256")
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and ("memory" in line or "allocate" in line), line


# ---- a thread count in a small address space ----

def test_python_calls_asking_for_16_threads_fit_what_the_address_space_leaves():
    """libgomp exits the process ("Thread creation failed") when a thread's stack does not fit in
    RLIMIT_AS: 16 threads asked for with 24 MB left above the process's size ended Python (exit 1).
    Each child caps its address space at its own size plus `room` MB, from no thread's worth to a
    few, and every call returns the bits one thread gives."""
    script = textwrap.dedent("""
        import resource, sys
        import numpy as np, qkv
        rng = np.random.default_rng(5)
        q = rng.standard_normal((1, 8, 512, 64)).astype(np.float32)
        cache = qkv.KVCache(num_pages=64, page_tokens=64, kv_heads=8, head_dim=64)
        seq = cache.create()
        kv = rng.standard_normal((2, 4000, 8, 64)).astype(np.float32)
        cache.append(seq, kv[0], kv[1])
        layer = qkv.MultiHeadAttention(embed_dim=512, num_heads=8, seed=1)
        x = rng.standard_normal((512, 512)).astype(np.float32)
        calls = {"sdpa": lambda t: qkv.scaled_dot_product_attention(q, q, q, num_threads=t),
                 "decode": lambda t: qkv.decode_attention(q[:, :, :64], cache, [seq], num_threads=t),
                 "layer": lambda t: layer.forward(x, num_threads=t)}
        want = {name: call(1) for name, call in calls.items()}
        vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (int(sys.argv[1]) << 20),) * 2)
        for name, call in calls.items():
            print(name, "same" if np.array_equal(call(16), want[name]) else "differs", flush=True)
    """)
    for room in (12, 24, 100, 250):
        proc = subprocess.run([sys.executable, "-c", script, str(room)], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        assert proc.returncode == 0 and "Thread creation failed" not in proc.stderr, (room, proc.stderr)
        assert proc.stdout.split() == ["sdpa", "same", "decode", "same", "layer", "same"], (room, proc.stdout)


def test_attend_asking_for_16_threads_runs_in_60mb(qkv_bin, tmp_path):
    """`ulimit -v 60000; qkv attend --threads 16` exited 1 with libgomp's "Thread creation failed"
    (a library thread count follows the same rule as Python's num_threads)."""
    q = np.random.default_rng(6).standard_normal((1, 8, 512, 64)).astype(np.float32)
    np.save(tmp_path / "q.npy", q)
    args = ["attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "q.npy", "--v", tmp_path / "q.npy", "--threads"]
    one = subprocess.run([qkv_bin, *map(str, args), "1", "--out", str(tmp_path / "one.npy")], capture_output=True,
                         text=True, timeout=60)
    assert one.returncode == 0, one.stderr
    for megabytes in (60, 80, 150):
        limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (megabytes << 20,) * 2)  # noqa: E731
        out = tmp_path / f"{megabytes}.npy"
        proc = subprocess.run([qkv_bin, *map(str, args), "16", "--out", str(out)], capture_output=True, text=True,
                              timeout=60, preexec_fn=limit)
        assert proc.returncode == 0, (megabytes, proc.stderr)
        assert np.array_equal(np.load(out), np.load(tmp_path / "one.npy")), megabytes


# ---- sentences from --input FILE, --input - and a "-" sentence (cause 6) ----

def test_sentence_from_a_file_or_stdin_matches_the_command_line(run, qkv_bin, tmp_path, embeddings):
    sentence = "the river bank is by the bank"
    (tmp_path / "s.txt").write_text(sentence + "\n")
    direct = run("context", "--embeddings", embeddings.glove, "--random-weights", "0", sentence)
    assert direct.returncode == 0, direct.stderr
    from_file = run("context", "--embeddings", embeddings.glove, "--random-weights", "0", "--input", tmp_path / "s.txt")
    assert from_file.stdout.split("\n", 1)[1] == direct.stdout.split("\n", 1)[1]
    for args in (["--input", "-"], ["-"]):
        # As `echo` pipes it: the final newline is no part of the sentence (the header quotes it).
        piped = subprocess.run([qkv_bin, "context", "--embeddings", str(embeddings.glove), "--random-weights", "0", *args],
                               input=sentence + "\n",
                               capture_output=True, text=True, timeout=60)
        assert piped.returncode == 0, piped.stderr
        assert piped.stdout == direct.stdout, args
    piped = subprocess.run([qkv_bin, "explain", "--embeddings", str(embeddings.glove), "--random-weights", "0", "-"],
                           input=sentence + "\n", capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and piped.stdout == run("explain", "--embeddings", embeddings.glove,
                                                         "--random-weights", "0", sentence).stdout
    explain = run("explain", "--embeddings", embeddings.glove, "--random-weights", "0", "--input", tmp_path / "s.txt")
    assert explain.returncode == 0 and explain.stdout == run("explain", "--embeddings", embeddings.glove, "--random-weights", "0",
                                                              sentence).stdout
    (tmp_path / "two.txt").write_text("the river bank\n\nwe sat by the bank\n")
    compare = run("compare", "--embeddings", embeddings.glove, "--random-weights", "0", "--word", "bank", "--input", tmp_path / "two.txt")
    assert compare.returncode == 0, compare.stderr
    assert compare.stdout == run("compare", "--embeddings", embeddings.glove, "--random-weights", "0", "--word", "bank", "the river bank",
                                 "we sat by the bank").stdout


def test_bad_input_files_are_refused(run, tmp_path, embeddings):
    proc = run("context", "--embeddings", embeddings.glove, "--random-weights", "0", "--input", tmp_path / "none.txt")
    assert proc.returncode == 1 and "none.txt" in proc.stderr and "No such file" in proc.stderr, proc.stderr
    proc = run("context", "--embeddings", embeddings.glove, "--random-weights", "0", "--input", tmp_path)
    assert proc.returncode == 1 and "Is a directory" in proc.stderr, proc.stderr
    (tmp_path / "one.txt").write_text("the bank\n")
    proc = run("compare", "--embeddings", embeddings.glove, "--random-weights", "0", "--word", "bank", "--input", tmp_path / "one.txt")
    assert proc.returncode == 1 and "expected 2 non-blank lines" in proc.stderr, proc.stderr
    proc = run("context", "--embeddings", embeddings.glove)
    assert proc.returncode == 2 and "--input" in proc.stderr, proc.stderr
    proc = run("context", "--embeddings", embeddings.glove, "--random-weights", "0", "--input", tmp_path / "one.txt", "the bank")
    assert proc.returncode == 2 and "excludes" in proc.stderr, proc.stderr


def test_long_sentence_from_input_file_beyond_the_argument_limit(run, tmp_path, embeddings):
    # 300,000 words (1.8 MB): more than one command-line argument may hold (128 KiB).
    words = np.array(embeddings.words)[np.random.default_rng(1).integers(0, len(embeddings.words), 300_000)]
    (tmp_path / "long.txt").write_text(" ".join(words))
    proc = run("context", "--embeddings", embeddings.glove, "--random-weights", "0", "--input", tmp_path / "long.txt", "--format", "npy",
               "--out", tmp_path / "c.npy", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert np.load(tmp_path / "c.npy").shape == (300_000, embeddings.matrix.shape[1])
