"""An output option naming a file the same command reads is refused before any work, with one
line naming both, exit 1, and the input left as it was: `qkv train --save words.txt` replaced the
word vectors it trained on with the layer. However the output is spelled: directly, through
`./`, through a symbolic link or a hard link to the input."""
import os
import subprocess

import numpy as np
import pytest

from qkv_testlib import EmbeddingFiles, leftovers, masked_word_files, write_layer


def _attend(d, rng):
    for name, shape in (("q", (2, 3, 4)), ("k", (2, 5, 4)), ("v", (2, 5, 3))):
        np.save(d / f"{name}.npy", rng.standard_normal(shape))
    np.save(d / "keep.npy", np.ones((3, 5), dtype=bool))
    np.save(d / "bias.npy", np.zeros((3, 5)))
    return ["attend", "--q", d / "q.npy", "--k", d / "k.npy", "--v", d / "v.npy", "--keep-mask", d / "keep.npy",
            "--bias", d / "bias.npy"]


def _sentence(command, *extra):
    def build(d, rng, emb):
        write_layer(d / "layer.safetensors", rng, E=6, H=1, D=3)
        args = ["--embeddings", emb.glove, "--weights", d / "layer.safetensors"]
        if command == "compare":
            return ["compare", *args, "--word", "bank", "the river bank", "the bank", *extra]
        return [command, *args, "the river bank", *extra]
    return build


def _train(task):
    def build(d, rng, emb):
        words, sentences = masked_word_files(d)
        (d / "exclude.txt").write_text("w1 w2 w3\n")
        extra = ["--exclude", d / "exclude.txt"] if task == "context" else []
        return ["train", "--task", task, "--embeddings", words, "--sentences", sentences, "--steps", "1",
                "--eval-examples", "4", *extra]
    return build


# (command, builder, output option, the input's file, its label in the message)
CASES = [
    ("attend", lambda d, rng, emb: _attend(d, rng) + ["--out", d / "o.npy"], "--lse", "q.npy", "--q"),
    ("attend", lambda d, rng, emb: _attend(d, rng), "--out", "v.npy", "--v"),
    ("attend", lambda d, rng, emb: _attend(d, rng) + ["--out", d / "o.npy"], "--weights", "keep.npy", "--keep-mask"),
    ("attend", lambda d, rng, emb: _attend(d, rng), "--out", "bias.npy", "--bias"),
    ("context", _sentence("context", "--format", "npy"), "--out", "glove.txt", "the word vectors"),
    ("context", _sentence("context"), "--html", "layer.safetensors", "the layer"),
    ("explain", _sentence("explain"), "--svg", "glove.txt", "the word vectors"),
    ("explain", _sentence("explain"), "--html", "layer.safetensors", "the layer"),
    ("compare", _sentence("compare"), "--html", "glove.txt", "the word vectors"),
    ("masked-word", _train("masked-word"), "--save", "words.txt", "the word vectors"),
    ("masked-word", _train("masked-word"), "--loss-csv", "sentences.txt", "the sentences"),
    ("context", _train("context"), "--loss-svg", "exclude.txt", "--exclude"),
]
SPELLINGS = ["direct", "dot", "symlink", "hardlink"]


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("command, build, option, name, label", CASES,
                         ids=[f"{c[0]}{c[2]}={c[3]}" for c in CASES])
def test_an_output_over_an_input_is_refused(qkv_bin, tmp_path, seed, command, build, option, name, label,
                                            spelling):
    d = tmp_path
    argv = build(d, np.random.default_rng(seed), EmbeddingFiles(d, np.random.default_rng(seed)))
    target = {"direct": d / name, "dot": f"{d}/./{name}", "symlink": d / "link", "hardlink": d / "hard"}[spelling]
    if spelling == "symlink":
        (d / "link").symlink_to(name)
    elif spelling == "hardlink":
        os.link(d / name, d / "hard")
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    r = subprocess.run([qkv_bin, *map(str, argv + [option, target])], capture_output=True, text=True,
                       errors="replace", timeout=120)
    err = r.stderr.strip()
    assert r.returncode == 1, (r.returncode, err)
    assert "\n" not in err, err
    assert f"{option} {target}: the same file as {label} " in err and "which this command reads" in err, err
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
    assert leftovers(d, keep=before) == []


def test_an_output_beside_its_input_is_written(run, tmp_path, embeddings):
    """Only the same file is refused: an output in the input's directory, or with its name in
    another directory, is written."""
    (tmp_path / "other").mkdir()
    for target in (tmp_path / "glove.html", tmp_path / "other" / "glove.txt"):
        r = run("context", "--embeddings", embeddings.glove, "--random-weights", "0", "the river bank", "--out",
                target)
        assert r.returncode == 0 and target.stat().st_size > 0, r.stderr
