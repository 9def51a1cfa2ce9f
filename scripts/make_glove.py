#!/usr/bin/python3
"""Writes a synthetic embedding file for measuring load time and memory.

    make_glove.py OUT [--words 400000] [--dim 300] [--format glove|word2vec-text|word2vec-binary] [--seed 0]

Text values look like GloVe's ("-0.0074364", "0.21318"); words are random lowercase strings made
unique by a suffix. Vectorized with numpy, so a 1 GB file takes seconds, not minutes.
"""
import argparse
import sys

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--words", type=int, default=400000)
    p.add_argument("--dim", type=int, default=300)
    p.add_argument("--format", choices=["glove", "word2vec-text", "word2vec-binary"], default="glove")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    words = ["".join(map(chr, rng.choice(letters, rng.integers(2, 10)))) + str(i) for i in range(a.words)]

    with open(a.out, "wb") as f:
        if a.format != "glove":
            f.write(f"{a.words} {a.dim}\n".encode())
        if a.format == "word2vec-binary":
            for start in range(0, a.words, 10000):
                block = (rng.standard_normal((min(10000, a.words - start), a.dim)) * 0.4).astype("<f4")
                f.write(b"".join(w.encode() + b" " + row.tobytes() + b"\n"
                                 for w, row in zip(words[start:start + len(block)], block)))
            return
        # A table of formatted values; each text cell is " value" padded with NUL bytes to a fixed
        # width, and a chunk of rows becomes bytes by dropping the NULs.
        values = rng.standard_normal(1 << 16) * 0.4
        table = [(" %.5g" % v).encode() for v in values]
        width = max(max(map(len, table)), max(len(w) for w in words) + 1)
        cells = np.zeros((len(table), width), np.uint8)
        for i, t in enumerate(table):
            cells[i, :len(t)] = np.frombuffer(t, np.uint8)
        for start in range(0, a.words, 10000):
            chunk = words[start:start + 10000]
            rows = np.zeros((len(chunk), a.dim + 2, width), np.uint8)
            for r, w in enumerate(chunk):
                rows[r, 0, :len(w)] = np.frombuffer(w.encode(), np.uint8)
            rows[:, 1:a.dim + 1] = cells[rng.integers(0, len(table), (len(chunk), a.dim))]
            rows[:, a.dim + 1, 0] = ord("\n")
            flat = rows.reshape(-1)
            f.write(flat[flat != 0].tobytes())


if __name__ == "__main__":
    sys.exit(main())
