"""Word-sense examples for the sense evaluation (scripts/sense_eval.py), built from text Debian ships.

WordNet 3.0 (package wordnet-base) quotes example sentences in its glosses: "they pulled the canoe
up on the bank" is an example of bank's sloping-land sense, "he cashed a check at the bank" of its
financial-institution one. An example belongs to a word when the word itself (not an inflection,
so every example of a word starts from the same static vector) is one of its tokens and names a
lemma of the synset that quotes it. A word is kept when at least two of its senses have at least
two examples each (leave-one-out nearest-centroid needs a centroid for every sense even without
the held-out sentence). data/senses-classic.txt adds hand-written sentences for the classic
ambiguous words (bank, bat, plant, spring, ...).

Tokens are split as qkv's tokenize() splits them (scripts/make_embeddings.py's tokenize).
"""
import os
import re

WORDNET_DIR = "/usr/share/wordnet"
CLASSIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "senses-classic.txt")
WORD = re.compile(r"[A-Za-z0-9\x80-\uffff]+")
QUOTED = re.compile(r'"([^"]+)"')


def tokenize(text):
    return [w.lower() for w in WORD.findall(text)]


def wordnet_examples(directory=WORDNET_DIR):
    """(word, sense key, tokens) for every quoted example that uses one of its synset's one-word lemmas."""
    out = []
    for pos in ("noun", "verb", "adj", "adv"):
        with open(os.path.join(directory, "data." + pos), encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue  # the licence
                head, _, gloss = line.partition(" | ")
                fields = head.split()
                n_words = int(fields[3], 16)
                lemmas = {fields[4 + 2 * i].lower().split("(")[0] for i in range(n_words)}
                lemmas = {w for w in lemmas if re.fullmatch(r"[a-z]+", w)}
                key = f"{pos}:{fields[0]}"
                for example in QUOTED.findall(gloss):
                    tokens = tokenize(example)
                    for word in sorted(lemmas & set(tokens)):
                        out.append((word, key, tokens))
    return out


def classic_examples(path=CLASSIC):
    """(word, sense key, tokens) of the hand-written file: lines 'word<TAB>sense<TAB>sentence'."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            word, sense, sentence = line.split("\t")
            tokens = tokenize(sentence)
            if word not in tokens:
                raise ValueError(f"{path}:{n}: '{word}' is not a word of \"{sentence}\"")
            out.append((word, f"classic:{word}:{sense}", tokens))
    return out


def sense_sets(vocab, directory=WORDNET_DIR, classic=CLASSIC, min_examples=2):
    """{word: [(sense key, tokens in vocab, index of the word)]} of the words that qualify.

    Tokens outside `vocab` are dropped (as `--oov skip` drops them); an example left with the word
    alone says nothing about its context and is dropped too. The hand-written senses of a word
    replace its WordNet ones (the two sense inventories are not aligned)."""
    examples = wordnet_examples(directory)
    handwritten = classic_examples(classic) if classic else []
    hand_words = {w for w, _, _ in handwritten}
    examples = [e for e in examples if e[0] not in hand_words] + handwritten
    by_word = {}
    seen = set()
    for word, key, tokens in examples:
        if word not in vocab:
            continue
        kept = [t for t in tokens if t in vocab]
        if len(kept) < 2 or (word, tuple(kept)) in seen:
            continue
        seen.add((word, tuple(kept)))
        by_word.setdefault(word, []).append((key, kept, kept.index(word)))
    result = {}
    for word, items in sorted(by_word.items()):
        counts = {}
        for key, _, _ in items:
            counts[key] = counts.get(key, 0) + 1
        good = {k for k, c in counts.items() if c >= min_examples}
        if len(good) >= 2:
            result[word] = [it for it in items if it[0] in good]
    return result


def sentences_of(sets):
    """Every evaluation sentence as one space-joined line (to keep them out of training)."""
    return {" ".join(tokens) for items in sets.values() for _, tokens, _ in items}
