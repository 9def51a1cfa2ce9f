"""Helpers for the `qkv` command tests: embedding file writers, an independent numpy attention
(following include/qkv/mask.h), a check for files a failed run left behind, where the build
under test is, and what the in-process A/B tools' tests (bench/*_ab.cpp) run them on."""
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest


def build_dir():
    """The build whose binaries the tests run: QKV_BIN's folder, else <repo>/build."""
    return Path(os.environ.get("QKV_BIN", Path(__file__).resolve().parents[2] / "build" / "qkv")).parent


def bench_tool(name):
    """A runner of build/bench/<name> that returns the finished process; it skips the test where
    the benchmarks are not built."""
    path = build_dir() / "bench" / name

    def run(*args):
        if not path.exists():
            pytest.skip(f"{path} is not built (QKV_BUILD_BENCH=OFF)")
        return subprocess.run([str(path), *map(str, args)], capture_output=True, text=True, timeout=300)
    return run


def own_shared_library():
    """This build's shared libqkv, the other side of an A/B tool run against itself (the same code
    on both sides, so the same bits); skips the test without one."""
    libs = sorted(build_dir().glob("libqkv.so.*"))
    if not libs:
        pytest.skip(f"no shared libqkv in {build_dir()} (QKV_BUILD_SHARED=OFF)")
    return libs[-1]


# The arguments every A/B tool refuses as usage errors (exit 2), each with what its message names;
# "LIB" stands for this build's shared library.
AB_USAGE_ERRORS = [
    ((), "lib_b is required"),
    (("LIB", "--rounds", "0"), "--rounds"),
    (("LIB", "--threads", "2,x"), "--threads"),
    (("LIB", "--bogus"), "--bogus"),
]


def check_ab_usage_error(tool, args, message):
    r = tool(*(str(own_shared_library()) if a == "LIB" else a for a in args))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr, r.stderr


def check_ab_refuses_libraries(tool, tmp_path, no_symbol):
    """A missing library, and one without qkv (libm), each refused with exit 1 and by name."""
    r = tool(tmp_path / "no-such-lib.so")
    assert r.returncode == 1 and "cannot load" in r.stderr and "no-such-lib.so" in r.stderr, r.stderr
    libm = next((p for p in (Path("/lib/x86_64-linux-gnu/libm.so.6"), Path("/lib/aarch64-linux-gnu/libm.so.6"),
                             Path("/usr/lib64/libm.so.6")) if p.exists()), None)
    if libm is None:
        pytest.skip("no libm.so.6 found to stand for a library without qkv")
    r = tool(libm)
    assert r.returncode == 1 and no_symbol in r.stderr, r.stderr


# Every word of the seeds' sentences that the tests use, plus a few more.
VOCABULARY = sorted(set("""
i am going to play playing outside the bank went deposit money we sat by river grows
word a sentence of static contextual cake piece easy task is and in on at it this that
""".split()))


def write_glove(path, words, matrix):
    with open(path, "w") as f:
        for w, row in zip(words, matrix):
            f.write(w + " " + " ".join(repr(float(x)) for x in row) + "\n")


def write_word2vec_text(path, words, matrix):
    with open(path, "w") as f:
        f.write(f"{len(words)} {matrix.shape[1]}\n")
        for w, row in zip(words, matrix):
            f.write(w + " " + " ".join(repr(float(x)) for x in row) + "\n")


def write_word2vec_binary(path, words, matrix):
    with open(path, "wb") as f:
        f.write(f"{len(words)} {matrix.shape[1]}\n".encode())
        for w, row in zip(words, matrix):
            f.write(w.encode() + b" " + struct.pack(f"<{len(row)}f", *row.astype(np.float32)) + b"\n")


class EmbeddingFiles:
    """Random float32-exact vectors for VOCABULARY in the three formats."""
    def __init__(self, directory, rng, dim=6):
        self.words = list(VOCABULARY)
        self.matrix = rng.standard_normal((len(self.words), dim)).astype(np.float32)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.glove = directory / "glove.txt"
        self.w2v_text = directory / "w2v.txt"
        self.w2v_bin = directory / "w2v.bin"
        write_glove(self.glove, self.words, self.matrix)
        write_word2vec_text(self.w2v_text, self.words, self.matrix)
        write_word2vec_binary(self.w2v_bin, self.words, self.matrix)

    def x(self, tokens):
        return np.array([self.matrix[self.index[t]] for t in tokens], dtype=np.float64)


def leftovers(directory, keep=()):
    """Files in `directory` other than `keep` (inputs): outputs or temporaries a failed run left."""
    return sorted(p.name for p in Path(directory).iterdir() if p.name not in set(keep))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention(q, k, v, scale=None, causal=None, diagonal="top_left", window=None, key_lengths=None,
              query_lengths=None, keep=None, bias=None, alibi=None, softcap=0.0):
    """softmax(scale·q·kᵀ + mask)·v in float64 for q [B,H,N,D], k [B,Hkv,M,D], v [B,Hkv,M,Dv],
    written from include/qkv/mask.h's text: the diagonal of query i in batch row b is i, or
    i + key_len[b] - query_len[b] for bottom_right; softcap, then bias, then -slope·|j - diag(i)|.
    Fully masked rows: out 0, weights 0, lse -inf. Returns (out, lse, weights)."""
    B, H, N, D = q.shape
    _, Hkv, M, Dv = v.shape
    group = H // Hkv
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    s = np.einsum("bhnd,bhmd->bhnm", q, k) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.broadcast_to(bias, (B, H, N, M))
    key_lengths = [M] * B if key_lengths is None else key_lengths
    query_lengths = [N] * B if query_lengths is None else query_lengths
    align = causal if causal else diagonal
    i = np.arange(N)[:, None]
    j = np.arange(M)[None, :]
    allowed = np.ones((B, H, N, M), dtype=bool)
    for b in range(B):
        diag = i + (key_lengths[b] - query_lengths[b]) if align == "bottom_right" else i
        a = (j < key_lengths[b]) & (i < query_lengths[b])
        if causal:
            a &= j <= diag
        if window is not None:
            left, right = window
            if left >= 0:
                a &= j >= diag - left
            if right >= 0:
                a &= j <= diag + right
        allowed[b] &= a
        if alibi is not None:
            s[b] = s[b] - np.asarray(alibi, dtype=np.float64)[:, None, None] * np.abs(j - diag)[None]
    if keep is not None:
        allowed &= np.broadcast_to(keep, (B, H, N, M)) != 0
    s = np.where(allowed, s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True) if M > 0 else np.full((B, H, N, 1), -np.inf)
    masked = row_max == -np.inf
    p = np.exp(s - np.where(masked, 0.0, row_max))
    total = p.sum(axis=-1, keepdims=True)
    weights = np.where(masked, 0.0, p / np.where(masked, 1.0, total))
    out = weights @ v
    with np.errstate(divide="ignore"):
        lse = np.where(masked, -np.inf, row_max + np.log(np.where(masked, 1.0, total)))[..., 0]
    return out, lse, weights


def write_safetensors(path, tensors, metadata=None):
    """Writes float32 tensors (dict name -> array) and string metadata as .safetensors."""
    import json
    header, blobs, offset = {}, [], 0
    for name, array in sorted(tensors.items()):
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_layer(path, rng, E, H, D, Dv=None, kv_heads=None, output_projection=True, bias=False, note=None):
    """A qkv layer file (MultiHeadAttention::save's format) with random weights; returns them."""
    Dv = D if Dv is None else Dv
    Hkv = H if kv_heads is None else kv_heads
    w = {"w_q": rng.uniform(-0.5, 0.5, (E, H * D)), "w_k": rng.uniform(-0.5, 0.5, (E, Hkv * D)),
         "w_v": rng.uniform(-0.5, 0.5, (E, Hkv * Dv))}
    if output_projection:
        w["w_o"] = rng.uniform(-0.5, 0.5, (H * Dv, E))
    if bias:
        w.update(b_q=rng.uniform(-0.5, 0.5, H * D), b_k=rng.uniform(-0.5, 0.5, Hkv * D),
                 b_v=rng.uniform(-0.5, 0.5, Hkv * Dv))
        if output_projection:
            w["b_o"] = rng.uniform(-0.5, 0.5, E)
    w = {name: a.astype(np.float32) for name, a in w.items()}
    metadata = {"qkv.format": "qkv.MultiHeadAttention/1", "qkv.embed_dim": str(E), "qkv.num_heads": str(H),
                "qkv.num_kv_heads": str(Hkv), "qkv.head_dim": str(D), "qkv.value_dim": str(Dv),
                "qkv.bias": "1" if bias else "0", "qkv.output_projection": "1" if output_projection else "0",
                "qkv.parameter_free": "0"}
    if note is not None:
        metadata["qkv.note"] = note
    write_safetensors(path, w, metadata)
    return {name: a.astype(np.float64) for name, a in w.items()}


def layer_forward(x, w, H, Hkv=None):
    """The layer in float64: per-head softmax(Q·Kᵀ/√D)·V, heads concatenated, then ·W_o + b_o."""
    Hkv = H if Hkv is None else Hkv
    q = x @ w["w_q"] + w.get("b_q", 0.0)
    k = x @ w["w_k"] + w.get("b_k", 0.0)
    v = x @ w["w_v"] + w.get("b_v", 0.0)
    D = q.shape[1] // H
    Dv = v.shape[1] // Hkv
    heads = []
    for h in range(H):
        hk = h // (H // Hkv)
        qh, kh, vh = q[:, h * D:(h + 1) * D], k[:, hk * D:(hk + 1) * D], v[:, hk * Dv:(hk + 1) * Dv]
        heads.append(softmax(qh @ kh.T / np.sqrt(D)) @ vh)
    out = np.concatenate(heads, axis=1)
    if "w_o" in w:
        out = out @ w["w_o"] + w.get("b_o", 0.0)
    return out


def allowed_pairs(n, m, causal, window, bottom_right=False):
    """[n, m] bool: which keys each query may see under a causal mask and a (left, right) window,
    the diagonal top-left (i) or bottom-right (i + m - n), as include/qkv/mask.h places it."""
    i, j = np.arange(n)[:, None] + (m - n if bottom_right else 0), np.arange(m)[None, :]
    allowed = np.ones((n, m), bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= (j >= i - window[0]) & (j <= i + window[1])
    return allowed


def masked_word_files(tmp_path, sentences_name="sentences.txt"):
    """A small masked-word corpus: 40 words of width 64 and 300 sentences of 12 words."""
    words = tmp_path / "words.txt"
    words.write_text("".join(f"w{i} " + " ".join(f"{((i * 7 + d * 3) % 11) / 10 - 0.5:.2f}" for d in range(64))
                             + "\n" for i in range(40)))
    sentences = os.path.join(os.fsencode(tmp_path), os.fsencode(sentences_name))
    sentences = sentences if isinstance(sentences_name, bytes) else os.fsdecode(sentences)
    with open(sentences, "w") as f:
        f.write("".join(" ".join(f"w{(s * 5 + t * 3) % 40}" for t in range(12)) + "\n" for s in range(300)))
    return words, sentences
