"""examples/contextual_embeddings.py runs, agrees with the module, and fails cleanly."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qkv

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "contextual_embeddings.py"


def _run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=env, timeout=60)


def test_example_writes_the_layer_output(tmp_path):
    words = ["we", "sat", "by", "the", "river", "bank", "went", "to", "deposit", "money"]
    matrix = np.random.default_rng(8000).standard_normal((len(words), 6)).astype(np.float32)
    glove = tmp_path / "glove.txt"
    glove.write_text("".join(w + " " + " ".join(repr(float(x)) for x in row) + "\n" for w, row in zip(words, matrix)))
    out = tmp_path / "context.npy"
    r = _run("We sat by the river bank", "--embeddings", str(glove), "--heads", "2", "--seed", "3",
             "--save", str(out), "--compare", "went to the bank to deposit money", "--word", "bank")
    assert r.returncode == 0, r.stderr
    assert "'bank': static vectors cos = 1.0000; contextual vectors cos =" in r.stdout
    layer = qkv.MultiHeadAttention(6, 2, seed=3)
    want = layer.forward(matrix[[0, 1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(np.load(out), want)


def test_example_parameter_free_demo_vocabulary():
    r = _run("the river bank", "--parameter-free")
    assert r.returncode == 0, r.stderr
    assert "parameter_free=True" in r.stdout and "river" in r.stdout


def test_example_errors_are_one_line():
    r = _run("!!!")
    assert r.returncode == 1 and r.stderr.strip() == "error: nothing to embed: the sentence has no words"
    r = _run("the bank", "--embeddings", "/nonexistent/glove.txt")
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "/nonexistent/glove.txt" in r.stderr
