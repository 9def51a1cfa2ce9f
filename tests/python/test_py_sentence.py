"""qkv.context / qkv.compare / qkv.explain(sentence=...): the trained layer by default, labelled as
the CLI labels it, and the same numbers as `qkv context` and `qkv compare` on the same files."""
import json
import shutil

import numpy as np
import pytest

import qkv
from qkv_testlib import VOCABULARY, write_glove

RIVER = "we sat on the bank of the river"
MONEY = "i went to the bank to deposit money"
CORPUS = [RIVER, MONEY, "the river grows in the bank", "we went to play outside in the cake",
          "i am going to deposit a piece of money", "it is an easy task to play"]


@pytest.fixture
def data_dir(tmp_path, seed, run, monkeypatch):
    """A data directory as `make demo` leaves it: words.txt and a layer trained on it by the CLI."""
    d = tmp_path / "data"
    d.mkdir()
    rng = np.random.default_rng(seed)
    write_glove(d / "words.txt", VOCABULARY, rng.standard_normal((len(VOCABULARY), 8)).astype(np.float32))
    (tmp_path / "sentences.txt").write_text("".join(s + "\n" for s in CORPUS * 20))
    p = run("train", "--task", "context", "--embeddings", d / "words.txt", "--sentences", tmp_path / "sentences.txt",
            "--steps", "20", "--batch", "4", "--seed", str(seed % 1000), "--save", d / "context-layer.safetensors")
    assert p.returncode == 0, p.stderr
    monkeypatch.setenv("QKV_DATA_DIR", str(d))
    monkeypatch.delenv("QKV_EMBEDDINGS", raising=False)
    return d


def test_default_is_the_trained_layer_and_says_so(data_dir, seed):
    s = qkv.load_layer()
    assert s.embeddings_path == str(data_dir / "words.txt")
    assert s.description.startswith("the trained layer context-layer.safetensors, 2 heads, d_k = 4: trained by "
                                    "`qkv train --task context`"), s.description
    for result in (qkv.context(RIVER), qkv.compare("bank", RIVER, MONEY)):
        assert result["layer"] == s.description
    page = qkv.explain(sentence=RIVER, format="html")
    assert isinstance(page, qkv.HtmlPage) and "trained (context-layer.safetensors)" in page
    d = qkv.explain(sentence=RIVER)
    assert d["title"] == f'Self-attention for "{RIVER}"' and s.description in d["source"]
    assert d["weights"] == "trained (context-layer.safetensors)"


def test_same_numbers_as_the_cli(data_dir, run, seed):
    p = run("context", "--format", "json", RIVER)
    assert p.returncode == 0, p.stderr
    cli = json.loads(p.stdout)
    py = qkv.context(RIVER)
    assert py["tokens"] == cli["tokens"] and py["layer"] == cli["layer"]
    np.testing.assert_allclose(py["vectors"], np.array(cli["vectors"]), rtol=0, atol=1e-6, err_msg=f"seed {seed}")
    p = run("compare", "--json", "--word", "bank", RIVER, MONEY)
    assert p.returncode == 0, p.stderr
    cli = json.loads(p.stdout)
    py = qkv.compare("bank", RIVER, MONEY)
    assert py["layer"] == cli["layer"] and abs(py["static_cosine"] - cli["static_cosine"]) < 1e-12
    assert abs(py["contextual_cosine"] - cli["contextual_cosine"]) < 1e-6, f"seed {seed}"
    for mine, theirs in zip(py["sentences"], cli["sentences"]):
        assert mine["position"] == theirs["position"]
        np.testing.assert_allclose(mine["weights"], theirs["weights"], atol=1e-6, err_msg=f"seed {seed}")


def test_random_and_parameter_free_only_on_request(data_dir, run, seed):
    r = qkv.context(RIVER, random_weights=7, num_heads=2)
    assert r["layer"] == "random W_q, W_k, W_v (seed 7), 2 heads, d_k = 4"
    p = run("context", "--format", "json", "--random-weights", "7", "--heads", "2", RIVER)
    assert p.returncode == 0, p.stderr
    np.testing.assert_allclose(r["vectors"], np.array(json.loads(p.stdout)["vectors"]), atol=1e-6)
    assert qkv.explain(sentence=RIVER, random_weights=7)["weights"] == "random (seed 7)"
    assert qkv.compare("bank", RIVER, MONEY, parameter_free=True)["layer"].startswith("parameter-free")


def test_missing_layer_says_how_to_get_it(tmp_path, monkeypatch, data_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(data_dir / "words.txt", empty / "words.txt")
    monkeypatch.setattr(qkv.sentence, "data_dirs", lambda: [empty])
    with pytest.raises(FileNotFoundError, match=r"no trained layer: `make demo` builds context-layer.safetensors.*"
                                                r"random_weights=SEED"):
        qkv.context(RIVER)
    monkeypatch.setattr(qkv.sentence, "data_dirs", lambda: [tmp_path / "nothing"])
    with pytest.raises(FileNotFoundError, match=r"no word vectors: pass embeddings=F, set QKV_EMBEDDINGS=F"):
        qkv.compare("bank", RIVER, MONEY)


def test_an_empty_qkv_embeddings_turns_the_default_off_as_for_the_command(monkeypatch):
    monkeypatch.setenv("QKV_EMBEDDINGS", "")
    with pytest.raises(FileNotFoundError, match=r"no word vectors: pass embeddings=F, set QKV_EMBEDDINGS=F"):
        qkv.context(RIVER)


def test_the_search_order(data_dir, monkeypatch, tmp_path):
    assert qkv.data_file("words.txt") == str(data_dir / "words.txt")
    assert qkv.sentence.data_dirs()[0] == data_dir
    monkeypatch.setenv("QKV_DATA_DIR", "")
    assert data_dir not in qkv.sentence.data_dirs()
    assert qkv.data_file("no-such-file.bin") is None


def test_layer_and_vectors_must_belong_together(data_dir, tmp_path, seed):
    other = tmp_path / "other.txt"
    write_glove(other, VOCABULARY, np.random.default_rng(seed + 1).standard_normal((len(VOCABULARY), 8)))
    with pytest.raises(ValueError, match=r"goes with the word vectors .*words.txt, not .*other.txt"):
        qkv.context(RIVER, embeddings=str(other))
    # A layer named explicitly is the user's choice: any vectors of its width go.
    r = qkv.context(RIVER, embeddings=str(other), weights=str(data_dir / "context-layer.safetensors"))
    assert r["layer"].startswith("learned weights from context-layer.safetensors")


@pytest.mark.parametrize("call, message", [
    (lambda: qkv.compare("bank money", RIVER, MONEY), r"exactly one token"),
    (lambda: qkv.compare("cake", RIVER, MONEY), r"sentence 1 .* does not contain 'cake'"),
    (lambda: qkv.compare("zebra", RIVER, MONEY), r"'zebra' is not in"),
    (lambda: qkv.context(RIVER, weights="x", random_weights=1), r"at most one of weights, random_weights"),
    (lambda: qkv.explain(weights="x"), r"weights applies only with sentence="),
    (lambda: qkv.explain("seed-003", sentence=RIVER), r"sentence= brings its own tokens"),
    (lambda: qkv.context(RIVER, layer=qkv.load_layer(), random_weights=2), r"either layer=SentenceLayer or"),
    (lambda: qkv.context("we sat by the zebra", random_weights=1), r"zebra"),
])
def test_bad_input(data_dir, call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_one_layer_many_sentences(data_dir):
    s = qkv.load_layer()
    a, b = qkv.context(RIVER, layer=s), qkv.context(RIVER)
    np.testing.assert_array_equal(a["vectors"], b["vectors"])
    with pytest.raises(TypeError, match="qkv.SentenceLayer"):
        qkv.context(RIVER, layer=qkv.MultiHeadAttention(8))
