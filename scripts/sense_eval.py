#!/usr/bin/python3
"""Does a layer separate word senses? The sense evaluation of qkv's contextual vectors.

    sense_eval.py WORDS.txt [--weights LAYER.safetensors] [--max-words N] [--seed S] [--json]
                  [--require ROW=POINTS ...]
    sense_eval.py WORDS.txt --write-sentences FILE

--write-sentences writes the evaluation's sentences, one per line, for `qkv train --exclude`: the
layer is never trained on a sentence it is judged by.

For every ambiguous word of scripts/senses.py's set (WordNet's quoted examples plus the
hand-written classics), each example sentence gives the word a contextual vector: the layer's
output row at the word. Leave-one-out nearest-centroid accuracy: each example in turn is held out,
the word's other examples give one centroid per sense, and the held-out vector is assigned to the
closest centroid by cosine. Every fold is centred on the mean of the word's other examples: the
vectors of one word share a large common direction, and without the centring a sense with more
examples draws the held-out vector to it and the accuracy of a sense-blind vector falls well below
chance. A vector identical for every example (the static word vector) guesses among the senses:
1/#senses. Accuracy is per word, then averaged over words (macro).

Rows (the same sentences, the same metric):
  chance            mean 1/#senses
  static vector     the word's own vector (the same in every sentence)
  shuffled senses   the trained layer with each word's sense labels permuted (the metric's null)
  bag of context    the mean of the other words' static vectors
  parameter-free    Q = K = V = X (seed 002): softmax(X·Xᵀ/√E)·X
  untrained layer   the trained layer's shape at its seeded initialization
  trained layer     --weights (default: context-layer.safetensors next to WORDS.txt)
The last lines give the trained layer's margin over the two baselines with a 95% bootstrap
interval over words (2,000 resamples, seeded). Needs qkv's Python module (PYTHONPATH=build/python).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import senses  # noqa: E402


def load_vectors(path):
    import qkv

    words, matrix = qkv.load_embeddings(path)
    return {w: i for i, w in enumerate(words)}, np.asarray(matrix, dtype=np.float32)


def word_accuracy(vectors, labels):
    """Leave-one-out nearest-centroid accuracy of one word's [n, d] vectors with sense labels."""
    vectors = np.asarray(vectors, dtype=np.float64)
    n = len(labels)
    classes = sorted(set(labels))
    label_idx = np.array([classes.index(s) for s in labels])
    total = vectors.sum(axis=0)
    sums = np.zeros((len(classes), vectors.shape[1]))
    counts = np.zeros(len(classes))
    for v, c in zip(vectors, label_idx):
        sums[c] += v
        counts[c] += 1
    score = 0.0
    for k in range(n):
        mean = (total - vectors[k]) / (n - 1)
        held = vectors[k] - mean
        s = sums.copy()
        cnt = counts.copy()
        s[label_idx[k]] -= vectors[k]
        cnt[label_idx[k]] -= 1
        centroids = s / cnt[:, None] - mean
        hn = np.linalg.norm(held)
        cn = np.linalg.norm(centroids, axis=1)
        scale = max(np.linalg.norm(vectors[k]), 1e-30)
        if hn <= 1e-6 * scale:
            score += 1.0 / len(classes)  # nothing to tell the senses apart: a guess
            continue
        cos = centroids @ held / (hn * np.where(cn > 0, cn, 1))
        best = np.flatnonzero(cos >= cos.max() - 1e-12)
        score += (label_idx[k] in best) / len(best)
    return score / n


def contextual_vectors(sets, encode):
    """Each word's [n, d] vectors from `encode(tokens, position) -> vector`, in the sets' order."""
    return [np.array([encode(t, p) for _, t, p in items]) for items in sets.values()]


def accuracies(vectors, labels):
    """Per-word accuracy of contextual_vectors() with one sense label list per word."""
    return np.array([word_accuracy(v, lab) for v, lab in zip(vectors, labels)])


def bootstrap(diff, seed, resamples=2000):
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (resamples, len(diff)))].mean(axis=1)
    return np.percentile(means, 2.5), np.percentile(means, 97.5)


class Encoders:
    """The rows' ways to give the word of a sentence a vector (encode(tokens, position))."""

    def __init__(self, index, vectors):
        self.index, self.vectors = index, vectors

    def rows(self, tokens):
        return self.vectors[[self.index[t] for t in tokens]]

    def static(self, tokens, p):
        return self.vectors[self.index[tokens[p]]]

    def bag(self, tokens, p):
        x = self.rows(tokens)
        return (x.sum(axis=0) - x[p]) / (len(tokens) - 1)

    def parameter_free(self, tokens, p):
        x = self.rows(tokens).astype(np.float64)
        s = x @ x[p] / np.sqrt(x.shape[1])
        w = np.exp(s - s.max())
        return (w / w.sum()) @ x

    def layer(self, layer):
        return lambda tokens, p: np.asarray(layer.forward(self.rows(tokens)))[p]


def evaluate(words_path, weights, max_words=0, seed=1):
    index, vectors = load_vectors(words_path)
    sets = senses.sense_sets(index)
    if max_words and len(sets) > max_words:
        keep = sorted(np.random.default_rng(seed).choice(sorted(sets), max_words, replace=False))
        sets = {w: sets[w] for w in keep}
    import qkv

    enc = Encoders(index, vectors)
    trained = qkv.MultiHeadAttention.load(weights)
    untrained = qkv.MultiHeadAttention(trained.embed_dim, trained.num_heads, trained.num_kv_heads, trained.head_dim,
                                       trained.value_dim, bias=trained.bias,
                                       output_projection=trained.output_projection, residual=trained.residual,
                                       seed=trained.seed)
    labels = [[s for s, _, _ in items] for items in sets.values()]
    trained_vectors = contextual_vectors(sets, enc.layer(trained))
    rows = {
        "chance": np.array([1.0 / len(set(lab)) for lab in labels]),
        "static vector": accuracies(contextual_vectors(sets, enc.static), labels),
        "bag of context": accuracies(contextual_vectors(sets, enc.bag), labels),
        "parameter-free": accuracies(contextual_vectors(sets, enc.parameter_free), labels),
        "untrained layer": accuracies(contextual_vectors(sets, enc.layer(untrained)), labels),
        "trained layer": accuracies(trained_vectors, labels),
    }
    rng = np.random.default_rng(seed)  # the null: each word's labels permuted, the same vectors
    rows["shuffled senses"] = accuracies(trained_vectors, [[lab[i] for i in rng.permutation(len(lab))] for lab in labels])
    margins = {}
    for base in ("bag of context", "parameter-free", "untrained layer"):
        diff = rows["trained layer"] - rows[base]
        lo, hi = bootstrap(diff, seed)
        margins[base] = {"margin": float(diff.mean()), "low": float(lo), "high": float(hi)}
    return {
        "words": len(sets),
        "senses": sum(len({s for s, _, _ in items}) for items in sets.values()),
        "sentences": sum(len(items) for items in sets.values()),
        "accuracy": {k: float(v.mean()) for k, v in rows.items()},
        "margins": margins,
        "weights": weights,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("words")
    p.add_argument("--weights", default=None)
    p.add_argument("--max-words", type=int, default=0, help="evaluate a seeded sample of this many words (0: all)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.add_argument("--write-sentences", metavar="FILE", help="write the evaluation's sentences and stop")
    p.add_argument("--require", action="append", default=[], metavar="ROW=POINTS",
                   help="exit 1 unless the trained layer beats ROW (bag of context, parameter-free, untrained "
                        "layer) by POINTS with its bootstrap interval above 0; repeatable")
    a = p.parse_args()
    if a.write_sentences:
        index, _ = load_vectors(a.words)
        lines = sorted(senses.sentences_of(senses.sense_sets(index)))
        tmp = a.write_sentences + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        os.replace(tmp, a.write_sentences)
        print(f"sense_eval: {len(lines)} evaluation sentences written to {a.write_sentences}")
        return
    weights = a.weights or os.path.join(os.path.dirname(os.path.abspath(a.words)), "context-layer.safetensors")
    if not os.path.exists(weights):
        sys.exit(f"sense_eval: no trained layer at {weights}: run `make demo` (or pass --weights F)")
    r = evaluate(a.words, weights, a.max_words, a.seed)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print_report(r)
    for spec in a.require:
        row, _, points = spec.partition("=")
        if row not in r["margins"]:
            sys.exit(f"sense_eval: --require {spec}: ROW must be one of {', '.join(r['margins'])}")
        m = r["margins"][row]
        if 100 * m["margin"] < float(points) or m["low"] <= 0:
            sys.exit(f"sense_eval: the trained layer beats {row} by {100 * m['margin']:+.1f} points "
                     f"(interval {100 * m['low']:+.1f} to {100 * m['high']:+.1f}), not by {points} with an interval "
                     f"above 0")


def print_report(r):
    print(f"sense evaluation: {r['words']} ambiguous words, {r['senses']} senses, {r['sentences']} sentences "
          f"(WordNet examples + data/senses-classic.txt); leave-one-out nearest-centroid, macro over words")
    order = ["chance", "static vector", "shuffled senses", "bag of context", "parameter-free", "untrained layer",
             "trained layer"]
    for name in order:
        print(f"  {name:<16} {100 * r['accuracy'][name]:5.1f} %")
    for base, m in r["margins"].items():
        print(f"  trained - {base}: {100 * m['margin']:+.1f} points (95% bootstrap over words: "
              f"{100 * m['low']:+.1f} to {100 * m['high']:+.1f})")


if __name__ == "__main__":
    main()
