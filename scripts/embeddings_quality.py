#!/usr/bin/python3
"""How good is a word-vector file, judged by WordNet (data no one here wrote)?

    embeddings_quality.py WORDS.txt [--wordnet-dir /usr/share/wordnet] [--shuffle SEED]

Reads WordNet 3.0's data and index files directly (no nltk). Positive pairs: two one-word lemmas
of the same synset (synonyms; "first-sense" when that synset is the most frequent sense of both
words, by WordNet's sense order), or the first lemmas of two synsets sharing a direct hypernym
(co-hyponyms, e.g. "oak"/"maple").
Negative pairs: random words of the same pool. Prints the ROC AUC of cosine similarity for each
kind (the chance that a WordNet pair scores above a random pair; 0.5 is noise) and the nearest
neighbours of a few probe words. --shuffle permutes which vector belongs to which word: the
negative control, whose AUC must fall to about 0.5.
"""
import argparse
import os
import sys

import numpy as np

WORDNET_DIR = "/usr/share/wordnet"
PROBES = ["king", "river", "money", "happy", "run", "dog", "church", "ship", "red", "sword"]


def load_vectors(path):
    words, rows = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split(" ")
            if len(parts) == 2 and not words:  # a word2vec text header
                continue
            words.append(parts[0])
            rows.append(np.asarray(parts[1:], dtype=np.float64))
    return words, np.vstack(rows)


def wordnet_lines(directory, kind):
    """The records of WordNet's kind.noun/.verb/.adj/.adv files (kind: 'data' or 'index'),
    skipping the license lines, which start with two spaces."""
    for pos in ("noun", "verb", "adj", "adv"):
        with open(os.path.join(directory, kind + "." + pos), encoding="latin-1") as f:
            yield from (line for line in f if not line.startswith("  "))


def read_synsets(directory):
    """{offset: (lemmas, hypernym offsets)} of every synset, keyed by 'pos:offset'."""
    synsets = {}
    for line in wordnet_lines(directory, "data"):
        fields = line.split(" | ", 1)[0].split()
        n_words = int(fields[3], 16)
        lemmas = [fields[4 + 2 * i].lower() for i in range(n_words)]
        lemmas = [w.split("(")[0] for w in lemmas if "_" not in w and "-" not in w]
        at = 4 + 2 * n_words
        n_ptr = int(fields[at])
        hypernyms = [f"{fields[at + 1 + 4 * i + 2].replace('s', 'a')}:{fields[at + 1 + 4 * i + 1]}" for i in range(n_ptr)
                     if fields[at + 1 + 4 * i] in ("@", "@i")]
        synsets[f"{fields[2].replace('s', 'a')}:{fields[0]}"] = (lemmas, hypernyms)
    return synsets


def first_senses(directory):
    """word -> {'pos:offset'} of its most frequent sense in each part of speech (listed first in index.<pos>)."""
    firsts = {}
    for line in wordnet_lines(directory, "index"):
        fields = line.split()
        n_ptr = int(fields[3])
        firsts.setdefault(fields[0], set()).add(f"{fields[1].replace('s', 'a')}:{fields[4 + n_ptr + 2]}")
    return firsts


def pairs_of(groups):
    return {(a, b) for g in groups for i, a in enumerate(g) for b in g[i + 1:]}


def wordnet_pairs(synsets, firsts, vocab):
    """(first-sense synonym pairs, all synonym pairs, co-hyponym pairs) of distinct in-vocabulary words.
    First-sense synonyms share a synset that is the most frequent sense of both words (WordNet's
    sense order): "money"/"cash" but not "bank"/"depository"."""
    children = {}
    for key, (lemmas, hypernyms) in synsets.items():
        for h in hypernyms:
            children.setdefault(h, []).append(key)
    synonyms = pairs_of(sorted({w for w in lemmas if w in vocab}) for lemmas, _ in synsets.values())
    first = pairs_of(sorted({w for w in lemmas if w in vocab and key in firsts.get(w, ())})
                     for key, (lemmas, _) in synsets.items())
    # Co-hyponyms: the first lemma of sibling synsets; huge classes (e.g. every city) say little.
    sibling_groups = [sorted({w for k in kids for w in synsets[k][0][:1] if w in vocab}) for kids in children.values()]
    cohyponyms = pairs_of(g for g in sibling_groups if len(g) <= 40)
    return sorted(first), sorted(synonyms), sorted(cohyponyms - synonyms)


def roc_auc(pos, neg):
    """P(a positive scores above a negative), ties counting half (Mann-Whitney U / (n_pos n_neg))."""
    scores = np.concatenate([pos, neg])
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # 1-based, ties get their mean rank
    return (ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def evaluate(words, vectors, wordnet_dir=WORDNET_DIR, seed=0, max_pairs=20000):
    """ROC AUCs and pair counts ({first_sense,synonym,cohyponym}_auc, n_*) and probe 'neighbours'."""
    rng = np.random.default_rng(seed)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms == 0, 1, norms)
    index = {w: i for i, w in enumerate(words)}
    first, synonyms, cohyponyms = wordnet_pairs(read_synsets(wordnet_dir), first_senses(wordnet_dir), index)
    pool = np.array(sorted({index[w] for pair in synonyms + cohyponyms for w in pair}))

    def cosines(pairs):
        if len(pairs) > max_pairs:
            pairs = [pairs[i] for i in rng.choice(len(pairs), max_pairs, replace=False)]
        a = np.array([index[p[0]] for p in pairs])
        b = np.array([index[p[1]] for p in pairs])
        return (unit[a] * unit[b]).sum(axis=1)

    ra, rb = rng.choice(pool, max_pairs), rng.choice(pool, max_pairs)
    keep = ra != rb
    random_cos = (unit[ra[keep]] * unit[rb[keep]]).sum(axis=1)
    neighbours = {}
    for probe in PROBES:
        if probe in index:
            sims = unit @ unit[index[probe]]
            top = [i for i in np.argsort(-sims, kind="stable")[:11] if i != index[probe]][:10]
            neighbours[probe] = [words[i] for i in top]
    return {"first_sense_auc": roc_auc(cosines(first), random_cos), "n_first_sense": len(first),
            "synonym_auc": roc_auc(cosines(synonyms), random_cos), "n_synonym": len(synonyms),
            "cohyponym_auc": roc_auc(cosines(cohyponyms), random_cos), "n_cohyponym": len(cohyponyms),
            "neighbours": neighbours}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("words")
    p.add_argument("--wordnet-dir", default=WORDNET_DIR)
    p.add_argument("--shuffle", type=int, default=None, help="negative control: permute the vectors with this seed")
    a = p.parse_args()
    words, vectors = load_vectors(a.words)
    if a.shuffle is not None:
        vectors = vectors[np.random.default_rng(a.shuffle).permutation(len(vectors))]
    r = evaluate(words, vectors, a.wordnet_dir)
    print(f"{len(words)} words x {vectors.shape[1]} dims")
    print(f"first-sense synonym pairs: {r['n_first_sense']:6d}  ROC AUC {r['first_sense_auc']:.3f}")
    print(f"all-sense synonym pairs:   {r['n_synonym']:6d}  ROC AUC {r['synonym_auc']:.3f}")
    print(f"co-hyponym pairs:          {r['n_cohyponym']:6d}  ROC AUC {r['cohyponym_auc']:.3f}")
    for probe, near in r["neighbours"].items():
        print(f"  {probe:8s} {', '.join(near)}")


if __name__ == "__main__":
    sys.exit(main())
