"""The sense evaluation's metric and data set (scripts/sense_eval.py, scripts/senses.py) on inputs
whose answer is known, so a broken metric cannot pass the real evaluation by accident."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import sense_eval  # noqa: E402
import senses  # noqa: E402


def clusters(rng, senses_count, per_sense, dim=8, spread=0.3, offset=5.0):
    """Vectors of one word: a large shared offset plus one tight cluster per sense."""
    centres = rng.standard_normal((senses_count, dim))
    vectors, labels = [], []
    for s in range(senses_count):
        for _ in range(per_sense):
            vectors.append(offset + centres[s] + spread * rng.standard_normal(dim))
            labels.append(f"s{s}")
    return np.array(vectors), labels


def test_separated_senses_score_full_marks(seed):
    rng = np.random.default_rng(seed)
    for k in (2, 3, 5):
        v, labels = clusters(rng, k, 4, spread=0.01)
        assert sense_eval.word_accuracy(v, labels) == 1.0, f"seed {seed}, {k} senses"


def test_identical_vectors_score_chance():
    v = np.ones((6, 4))
    assert sense_eval.word_accuracy(v, ["a", "a", "b", "b", "c", "c"]) == pytest.approx(1 / 3)


def test_labels_unrelated_to_the_vectors_score_chance(seed):
    """The null: i.i.d. vectors (sharing one large offset) with random labels score about
    1/#senses over many words. 2,000 words put the mean's standard error near 0.008, so the bounds
    sit 5 of them away (with 400, seed 1674495191 read 0.544 for 2 senses, 2.5 of them)."""
    rng = np.random.default_rng(seed)
    for k, per in ((2, 3), (3, 3)):
        scores = [sense_eval.word_accuracy(5.0 + rng.standard_normal((k * per, 8)),
                                           list(rng.permutation([f"s{i // per}" for i in range(k * per)])))
                  for _ in range(2000)]
        assert -0.06 < np.mean(scores) - 1 / k < 0.04, f"seed {seed}: {k} senses, null mean {np.mean(scores):.3f}"


def test_held_out_vector_never_sees_itself():
    """Two examples per sense: the held-out one's centroid is its sense-mate alone, so a sense
    whose two examples disagree must be missed, whatever the held-out vector is."""
    v = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    assert sense_eval.word_accuracy(v, ["a", "a", "b", "b"]) < 0.5


def test_bootstrap_interval_contains_the_mean(seed):
    diff = np.random.default_rng(seed).normal(0.05, 0.2, 300)
    lo, hi = sense_eval.bootstrap(diff, seed)
    assert lo < diff.mean() < hi and hi - lo < 0.1


def write_wordnet(directory):
    """A two-synset WordNet data.noun with quoted examples (the licence's two-space lines skipped)."""
    lines = [
        "  1 This software and database is provided as is\n",
        '00000001 06 n 01 bank 0 000 | sloping land; "the canoe was pulled up on the bank"; "the bank of the river"\n',
        '00000002 06 n 01 bank 0 000 | a financial institution; "he cashed a check at the bank"; '
        '"the bank lent money"; "banks closed"\n',
        '00000003 06 n 01 crane 0 000 | a bird; "a crane in the marsh"\n',
    ]
    (directory / "data.noun").write_text("".join(lines), encoding="latin-1")
    for pos in ("verb", "adj", "adv"):
        (directory / f"data.{pos}").write_text("", encoding="latin-1")


def test_senses_from_wordnet_examples(tmp_path):
    write_wordnet(tmp_path)
    vocab = set("the canoe was pulled up on bank of river he cashed a check at lent money banks closed".split())
    sets = senses.sense_sets(vocab, directory=str(tmp_path), classic=None)
    assert list(sets) == ["bank"]  # crane: one sense with one example
    keys = [k for k, _, _ in sets["bank"]]
    assert keys == ["noun:00000001"] * 2 + ["noun:00000002"] * 2  # "banks" is not the word itself
    _, tokens, position = sets["bank"][2]
    assert tokens[position] == "bank" and tokens == "he cashed a check at the bank".split()


def test_classic_file_rejects_a_sentence_without_its_word(tmp_path):
    bad = tmp_path / "classic.txt"
    bad.write_text("bank\triver\twe sat by the water\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'bank' is not a word of"):
        senses.classic_examples(str(bad))


def test_every_classic_sentence_uses_its_word():
    rows = senses.classic_examples()
    assert len({w for w, _, _ in rows}) >= 8
    for word in {w for w, _, _ in rows}:
        counts = {}
        for w, key, _ in rows:
            if w == word:
                counts[key] = counts.get(key, 0) + 1
        assert len(counts) >= 2 and min(counts.values()) >= 3, (word, counts)


def test_missing_layer_says_how_to_get_it(tmp_path):
    words = tmp_path / "words.txt"
    words.write_text("bank 0.1 0.2\n", encoding="utf-8")
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, str(SCRIPTS / "sense_eval.py"), str(words)], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 1
    assert "no trained layer at" in proc.stderr and "make demo" in proc.stderr
