#!/usr/bin/python3
"""Writes the small seed corpora in fuzz/corpus/<target>/ (run once; the files are committed).
Each seed is a valid or nearly valid input, so the fuzzers start from the formats' structure."""
import io
import json
import os
import struct
import sys

import numpy as np

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
rng = np.random.default_rng(7)


def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def npy(a, version=None):
    b = io.BytesIO()
    if version is None:
        np.save(b, a)
    else:
        np.lib.format.write_array(b, a, version=version)
    return b.getvalue()


# .npy: every dtype the reader lists, ranks 0-4, Fortran order, format versions 1-3, empty arrays.
put("npy", "f4_2x3", npy(rng.standard_normal((2, 3)).astype("<f4")))
put("npy", "f8_rank0", npy(np.array(1.5)))
put("npy", "f2_4", npy(rng.standard_normal(4).astype("<f2")))
put("npy", "b1_2x2", npy(np.array([[True, False], [False, True]])))
put("npy", "u1_3", npy(np.array([0, 7, 255], dtype="u1")))
put("npy", "i1_3", npy(np.array([-1, 0, 5], dtype="i1")))
put("npy", "i4_2x2x2", npy(np.arange(8, dtype="<i4").reshape(2, 2, 2)))
put("npy", "i8_1x1x1x3", npy(np.arange(3, dtype="<i8").reshape(1, 1, 1, 3)))
put("npy", "f4_fortran", npy(np.asfortranarray(rng.standard_normal((3, 2)).astype("<f4"))))
put("npy", "f4_v2", npy(np.ones((2, 2), "<f4"), version=(2, 0)))
put("npy", "f4_v3", npy(np.ones((1, 2), "<f4"), version=(3, 0)))
put("npy", "f4_empty", npy(np.zeros((0, 3), "<f4")))
put("npy", "f8_special", npy(np.array([np.nan, np.inf, -np.inf, 5e-324, 1e300])))
put("npy", "f4_big_endian", npy(np.ones(2, ">f4")))

# safetensors: the JSON header, each dtype, metadata, an empty tensor.
def safetensors(tensors, metadata=None):
    header, chunks, offset = {}, [], 0
    for name, (dtype, a) in tensors.items():
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


put("safetensors", "f32_meta", safetensors({"w": ("F32", rng.standard_normal((2, 3)).astype("<f4"))}, {"format": "pt"}))
put("safetensors", "mixed", safetensors({
    "a": ("F64", rng.standard_normal(3)),
    "b": ("F16", rng.standard_normal((2, 2)).astype("<f2")),
    "c": ("BF16", np.array([0x3f80, 0xc000], dtype="<u2")),
    "d": ("I32", np.arange(4, dtype="<i4")),
    "e": ("U8", np.arange(3, dtype="u1")),
    "f": ("BOOL", np.array([1, 0], dtype="u1")),
}))
put("safetensors", "empty_tensor", safetensors({"z": ("F32", np.zeros((0, 4), "<f4")), "s": ("F32", np.ones((), "<f4"))}))
put("safetensors", "no_tensors", safetensors({}, {"k": "v"}))

# Embeddings.
put("glove", "small", b"the 0.1 0.2 -0.3\ncat 1e-3 2.5 3\nParis 1 2 3\n")
put("glove", "spaces_crlf", b". . . 0.5 0.25\r\nbank 1 -1\r\n\r\nbank 2 2\r\n")
put("glove", "unicode", "caf\u00e9 0.5 1.5\n\u65e5\u672c 1 2\n".encode())
put("word2vec_text", "small", b"3 2\nthe 0.1 0.2\ncat 1 2\ndog -1 -2\n")
put("word2vec_text", "tabs", b"2 3\na\t1\t2\t3\nb 4 5 6\n")
def w2v_binary(words, dim):
    out = [f"{len(words)} {dim}\n".encode()]
    for w in words:
        out.append(w.encode() + b" " + rng.standard_normal(dim).astype("<f4").tobytes() + b"\n")
    return b"".join(out)
put("word2vec_binary", "small", w2v_binary(["the", "cat", "Dog"], 3))
put("word2vec_binary", "one", w2v_binary(["x"], 1))
put("word2vec_binary", "no_newlines", w2v_binary(["a", "b"], 2).replace(b"\n", b"", 2)[:0] + b"2 2\na " + struct.pack("<2f", 1, 2) + b"b " + struct.pack("<2f", 3, 4))

# attend_shapes takes structured bytes (FuzzedDataProvider): a few random and a few patterned.
for i in range(6):
    put("attend_shapes", f"random_{i}", rng.integers(0, 256, 64 + 64 * i, dtype=np.uint8).tobytes())
put("attend_shapes", "ones", bytes([1]) * 256)
put("attend_shapes", "ramp", bytes(range(256)))
print("seeds written to", root, file=sys.stderr)
