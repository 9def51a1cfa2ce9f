#!/usr/bin/python3
"""Trains word vectors on English text that Debian ships and writes them as a GloVe text file.

    make_embeddings.py OUT_DIR [--corpus gcide|wordnet|both] [--dim 50] [--epochs 10] [--seed 1]

Writes OUT_DIR/words.txt (GloVe text: "word v1 ... vD", most frequent words first) and
OUT_DIR/sentences.txt (the tokenized training sentences, one per line, which `qkv train --task
masked-word` learns from). The corpora:
  gcide    the Collaborative International Dictionary of English (Debian package dict-gcide,
           /usr/share/dictd/gcide.dict.dz): Webster's 1913 definitions and their quotations.
  wordnet  WordNet 3.0's glosses and example sentences (package wordnet-base, /usr/share/wordnet).
The dictionary's "Syn:" lists are dropped, so WordNet's synonym sets (the oracle of
tests/python/test_embeddings_quality.py) are never shown to the trainer as such.

Words are split exactly as qkv's tokenize() splits them (lowercase ASCII letters and digits; bytes
>= 0x80 stay inside a word), so every word of the file can be looked up by the CLI.

Reproducible: gensim's word2vec with one worker thread, a fixed seed and PYTHONHASHSEED=0 (gensim
seeds each word's initial vector from Python's string hash) gives the same bytes on every run.
"""
import argparse
import gzip
import os
import re
import sys
import time

GCIDE = "/usr/share/dictd/gcide.dict.dz"
WORDNET_DIR = "/usr/share/wordnet"
WORD = re.compile(rb"[A-Za-z0-9\x80-\xff]+")
SENTENCE_END = re.compile(rb"(?<=[.;:!?])\s+|\s--\s")


def tokenize(text):
    """qkv's tokenize(): ASCII letters lowered, everything that is not a word byte separates."""
    return [w.lower().decode("utf-8", "replace") for w in WORD.findall(text)]


def missing_package(what, package):
    sys.exit(f"make_embeddings: {what} not found: install the Debian package {package} "
             f"(apt-get install {package}, or run scripts/install-deps.sh)")


def gcide_sentences(path):
    """Definitions and quotations of GCIDE; headword lines, pronunciations, sources and Syn: lists dropped."""
    if not os.path.exists(path):
        missing_package(path, "dict-gcide")
    with gzip.open(path, "rb") as f:
        data = f.read()
    start = data.find(b"\nA \\")  # the first entry, after the database's licence header
    for para in re.split(rb"\n\s*\n", data[max(start, 0):]):
        lines = para.split(b"\n")
        body = [ln for ln in lines if ln.startswith(b" ")]  # column-0 lines are headwords
        if not body or body[0].lstrip().startswith((b"Syn:", b"See", b"[")):
            continue
        text = b" ".join(ln.strip() for ln in body)
        text = re.sub(rb"\[[^\]]*\]|\\[^\\]*\\|\{|\}", b" ", text)  # [source], \pronunciation\, {markup}
        text = re.sub(rb"^\d+\.\s|\s\d+\.\s|\(\w\)\s", b" ", text)  # sense numbers "1." "(a)"
        for piece in SENTENCE_END.split(text):
            words = tokenize(piece)
            if len(words) >= 3:
                yield words


def wordnet_sentences(directory):
    """Each gloss's definition and each of its quoted examples."""
    for pos in ("noun", "verb", "adj", "adv"):
        path = os.path.join(directory, "data." + pos)
        if not os.path.exists(path):
            missing_package(path, "wordnet-base")
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"  ") or b" | " not in line:
                    continue  # the licence header
                gloss = line.split(b" | ", 1)[1]
                for piece in gloss.split(b";"):
                    words = tokenize(piece)
                    if len(words) >= 3:
                        yield words


def read_corpus(name, gcide, wordnet):
    sentences = []
    if name in ("gcide", "both"):
        sentences += gcide_sentences(gcide)
    if name in ("wordnet", "both"):
        sentences += wordnet_sentences(wordnet)
    return sentences


def write_atomic(path, write):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        write(f)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--corpus", choices=["gcide", "wordnet", "both"], default="gcide")
    p.add_argument("--dim", type=int, default=50)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--min-count", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-sentences", type=int, default=0, help="use only the first N sentences (0: all; for tests)")
    p.add_argument("--gcide", default=GCIDE, help="the GCIDE dictzip file (default %(default)s)")
    p.add_argument("--wordnet-dir", default=WORDNET_DIR, help="WordNet's data files (default %(default)s)")
    a = p.parse_args()
    if os.environ.get("PYTHONHASHSEED") != "0":  # gensim's initial vectors depend on hash(): fix it
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))

    t0 = time.time()
    sentences = read_corpus(a.corpus, a.gcide, a.wordnet_dir)
    if a.max_sentences > 0:
        sentences = sentences[: a.max_sentences]
    tokens = sum(len(s) for s in sentences)
    print(f"make_embeddings: {a.corpus}: {len(sentences)} sentences, {tokens} words ({time.time() - t0:.1f} s)",
          flush=True)
    try:  # after the corpus check, so a missing corpus fails fast
        from gensim.models import Word2Vec
    except ImportError:
        missing_package("the Python module gensim", "python3-gensim")

    model = Word2Vec(sentences, vector_size=a.dim, window=5, min_count=a.min_count, sg=1, negative=5,
                     sample=1e-4, epochs=a.epochs, seed=a.seed, workers=1)
    kv = model.wv
    print(f"make_embeddings: {len(kv.index_to_key)} words x {a.dim} dims ({time.time() - t0:.1f} s)", flush=True)
    os.makedirs(a.out_dir, exist_ok=True)

    def write_vectors(f):
        for word in kv.index_to_key:
            f.write(word + " " + " ".join(f"{v:.5f}" for v in kv[word]) + "\n")

    def write_sentences(f):
        for s in sentences:
            f.write(" ".join(s) + "\n")

    write_atomic(os.path.join(a.out_dir, "sentences.txt"), write_sentences)
    write_atomic(os.path.join(a.out_dir, "words.txt"), write_vectors)
    print(f"make_embeddings: wrote {os.path.join(a.out_dir, 'words.txt')} ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
