"""qkv.load_embeddings, qkv.Embeddings and qkv.tokenize on small generated files."""

import struct

import numpy as np
import pytest

import qkv
from py_oracle import rng_for, seed_note


WORDS = ["the", "bank", "river", "money", "Paris", "deposit"]


def _vectors(case, dim=5):
    return rng_for(case).standard_normal((len(WORDS), dim)).astype(np.float32)


def _write_glove(path, vectors):
    with open(path, "w") as f:
        for w, row in zip(WORDS, vectors):
            f.write(w + " " + " ".join(repr(float(x)) for x in row) + "\n")


def _write_word2vec_binary(path, vectors):
    with open(path, "wb") as f:
        f.write(f"{len(WORDS)} {vectors.shape[1]}\n".encode())
        for w, row in zip(WORDS, vectors):
            f.write(w.encode() + b" " + struct.pack(f"<{len(row)}f", *row) + b"\n")


@pytest.mark.parametrize("writer, fmt", [(_write_glove, "auto"), (_write_glove, "glove"),
                                         (_write_word2vec_binary, "auto"), (_write_word2vec_binary, "word2vec_binary")])
def test_load_embeddings_returns_words_and_matrix(tmp_path, writer, fmt):
    vectors = _vectors(6000)
    path = tmp_path / "vectors.txt"
    writer(path, vectors)
    words, matrix = qkv.load_embeddings(str(path), format=fmt)
    assert words == WORDS
    assert matrix.dtype == np.float32 and matrix.shape == (6, 5)
    assert np.array_equal(matrix, vectors), seed_note(6000)
    assert not matrix.flags.writeable


def test_embeddings_lookup_and_sentence(tmp_path):
    vectors = _vectors(6100, dim=3)
    path = tmp_path / "glove.txt"
    _write_glove(path, vectors)
    emb = qkv.Embeddings.load(str(path))
    assert len(emb) == 6 and emb.dim == 3 and "river" in emb and "ocean" not in emb
    assert emb.find("paris") == 4  # the tokenizer lowercases; a cased vocabulary still matches
    assert np.array_equal(emb.vector("money"), vectors[3])
    tokens, x, missing = emb.embed("The river bank!")
    assert tokens == ["the", "river", "bank"] and missing == []
    assert np.array_equal(x, vectors[[0, 2, 1]]), seed_note(6100)
    tokens, x, missing = emb.embed("the ocean bank", oov="zero")
    assert tokens == ["the", "ocean", "bank"] and missing == ["ocean"] and np.all(x[1] == 0)
    tokens, x, missing = emb.embed("the ocean bank", oov="skip")
    assert tokens == ["the", "bank"] and x.shape == (2, 3)
    with pytest.raises(ValueError, match="ocean"):
        emb.embed("the ocean bank")
    with pytest.raises(ValueError, match="oov must be 'error', 'zero' or 'skip', got 'drop'"):
        emb.embed("the bank", oov="drop")
    with pytest.raises(KeyError, match="'ocean' is not in the vocabulary"):
        emb.vector("ocean")


def test_embeddings_from_arrays_and_tokenize():
    vectors = _vectors(6200, dim=4).astype(np.float64)
    emb = qkv.Embeddings(WORDS, vectors)
    assert np.array_equal(emb.matrix, vectors.astype(np.float32)) and emb.words == WORDS
    with pytest.raises(ValueError, match=r"matrix: shape \[5, 4\] must be \[V, E\] with V = 6 words"):
        qkv.Embeddings(WORDS, vectors[:5])
    assert qkv.tokenize("The bank's river-side, café!") == ["the", "bank", "s", "river", "side", "café"]


def test_malformed_files_raise_value_error_naming_the_file(tmp_path):
    ragged = tmp_path / "ragged.txt"
    ragged.write_text("a 1 2 3\nb 1 2\n")
    with pytest.raises(ValueError, match="ragged.txt"):
        qkv.load_embeddings(str(ragged))
    truncated = tmp_path / "truncated.bin"
    _write_word2vec_binary(truncated, _vectors(6300))
    truncated.write_bytes(truncated.read_bytes()[:-7])
    with pytest.raises(ValueError, match="truncated.bin"):
        qkv.load_embeddings(str(truncated), format="word2vec_binary")
    with pytest.raises(ValueError, match="format must be 'auto', 'glove'"):
        qkv.load_embeddings(str(ragged), format="fasttext")
    # Paths may be os.PathLike; arguments of the wrong kind are refused by name (they dumped the
    # binding's signature, and a lone surrogate leaked pybind11's cast error).
    ok = tmp_path / "ok.txt"
    ok.write_text("a 1 2\nb 3 4\n")
    assert qkv.load_embeddings(ok)[0] == ["a", "b"]
    e = qkv.Embeddings.load(ok)
    assert "a" in e and 1 not in e
    for call, exc, message in [
            (lambda: qkv.Embeddings.load(None), TypeError, r"path must be a path \(str, bytes or os.PathLike\), got None"),
            (lambda: qkv.Embeddings.load(str(ragged), format=None), TypeError, "format must be a string, got None"),
            (lambda: qkv.Embeddings("ab", np.ones((2, 2), np.float32)), TypeError, "words must be a list of strings"),
            (lambda: qkv.Embeddings([1, 2], np.ones((2, 2), np.float32)), TypeError,
             r"words\[0\] must be a string, got 1"),
            (lambda: e.find(None), TypeError, "word must be a string, got None"),
            (lambda: e.embed("a", oov=None), TypeError, "oov must be a string, got None"),
            (lambda: qkv.tokenize("\udcff"), ValueError, "sentence = .* is not valid Unicode text")]:
        with pytest.raises(exc, match=message):
            call()
    # A message quoting bytes that are not UTF-8 keeps its text (it was an empty ValueError).
    binary = tmp_path / "binary.bin"
    binary.write_bytes(b"\x80")
    with pytest.raises(ValueError, match=r"binary.bin: line 1: expected a word2vec header .*\\x80"):
        qkv.load_embeddings(str(binary), format="word2vec_binary")


def test_an_empty_vocabulary_or_width_is_refused_as_a_file_of_one_is(tmp_path):
    """Embeddings([], zeros((0, 3))) and Embeddings(words, zeros((V, 0))) were accepted, while
    loading a file that gives the same is refused."""
    path = tmp_path / "empty.txt"
    path.write_text("\n\n")  # GloVe without a row
    with pytest.raises(ValueError, match=": the vocabulary is empty \\(no rows of vectors\\)$"):
        qkv.Embeddings.load(str(path))
    with pytest.raises(ValueError, match=r"^Embeddings: the vocabulary is empty \(no words\)$"):
        qkv.Embeddings([], np.zeros((0, 3), np.float32))
    path.write_text("2 0\na\nb\n")
    with pytest.raises(ValueError, match=": line 1: the header declares vectors of 0 dimensions$"):
        qkv.Embeddings.load(str(path))
    with pytest.raises(ValueError, match=r"^Embeddings: the vectors have 0 dimensions \(matrix shape \[2, 0\]\)$"):
        qkv.Embeddings(["a", "b"], np.zeros((2, 0), np.float32))


def test_a_file_the_address_space_cannot_map_is_memory_error(tmp_path):
    """mmap's ENOMEM under RLIMIT_AS was a plain "cannot map" ValueError; it is MemoryError, with the
    size asked for. A sparse file, so nothing is written; the cap is set in a child process."""
    import os
    import subprocess
    import sys
    import textwrap
    path = tmp_path / "big.txt"
    with open(path, "wb") as f:
        f.truncate(2 << 30)
    script = textwrap.dedent(f"""
        import resource, qkv
        resource.setrlimit(resource.RLIMIT_AS, (1200 << 20, resource.RLIM_INFINITY))
        for load in (qkv.load_embeddings, qkv.Embeddings.load):
            try:
                load({str(path)!r})
                print("no error")
            except Exception as e:
                print(f"{{type(e).__name__}}: {{e}}")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    want = f"MemoryError: cannot map {path}: cannot allocate {2 << 30} bytes (out of memory)"
    assert proc.stdout.splitlines() == [want, want], (proc.stdout, proc.stderr)
