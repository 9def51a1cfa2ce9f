"""The real-word vectors (scripts/make_embeddings.py, built by `make demo` into <build>/data/) judged
by WordNet, which no one here wrote: synonym and co-hyponym pairs must score a higher cosine than
random pairs (ROC AUC), and probe words' nearest neighbours must include WordNet relatives. A
shuffled copy of the same vectors is the negative control: the same checks must fail on it. Also:
the script is reproducible (same seed, same bytes) and names the Debian package of a missing corpus."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import embeddings_quality as quality  # noqa: E402

SCRIPT = ROOT / "scripts" / "make_embeddings.py"
WORDNET = Path(quality.WORDNET_DIR)


@pytest.fixture(scope="module")
def real_vectors(qkv_bin):
    path = Path(qkv_bin).parent / "data" / "words.txt"
    if not path.exists():
        pytest.skip(f"{path} not built (it takes minutes): `make demo` or `cmake --build build --target embeddings`")
    return quality.load_vectors(path)


def related(synsets):
    """word -> the words WordNet puts in one of its synsets or in a sibling synset (same hypernym)."""
    children, by_word = {}, {}
    for key, (lemmas, hypernyms) in synsets.items():
        for h in hypernyms:
            children.setdefault(h, []).append(key)
    for key, (lemmas, hypernyms) in synsets.items():
        family = set(lemmas)
        for h in hypernyms:
            family.update(w for k in children[h] for w in synsets[k][0])
        for w in lemmas:
            by_word.setdefault(w, set()).update(family - {w})
    return by_word


def neighbour_hits(result, family):
    """Probes whose 10 nearest neighbours include a WordNet relative."""
    return [p for p, near in result["neighbours"].items() if family.get(p, set()) & set(near)]


def test_wordnet_pairs_beat_random_pairs_and_shuffled_vectors_do_not(real_vectors):
    words, vectors = real_vectors
    assert len(words) >= 20000 and 50 <= vectors.shape[1] <= 100, (len(words), vectors.shape)
    real = quality.evaluate(words, vectors)
    shuffled = quality.evaluate(words, vectors[np.random.default_rng(0).permutation(len(words))])
    family = related(quality.read_synsets(quality.WORDNET_DIR))
    hits, control_hits = neighbour_hits(real, family), neighbour_hits(shuffled, family)
    print(f"real:     first-sense synonym AUC {real['first_sense_auc']:.3f} ({real['n_first_sense']} pairs), "
          f"synonym AUC {real['synonym_auc']:.3f} ({real['n_synonym']} pairs), "
          f"co-hyponym AUC {real['cohyponym_auc']:.3f} ({real['n_cohyponym']} pairs), probes with a relative "
          f"among 10 neighbours: {len(hits)}/{len(real['neighbours'])}")
    print(f"shuffled: first-sense {shuffled['first_sense_auc']:.3f}, synonym AUC {shuffled['synonym_auc']:.3f}, "
          f"co-hyponym AUC {shuffled['cohyponym_auc']:.3f}, "
          f"probes: {len(control_hits)}")
    for probe, near in real["neighbours"].items():
        print(f"  {probe}: {', '.join(near)}")
    assert real["n_first_sense"] > 1000 and real["n_synonym"] > 1000 and real["n_cohyponym"] > 1000
    assert real["first_sense_auc"] >= 0.80, real  # measured 0.837; the target is 0.75
    assert real["synonym_auc"] >= 0.70 and real["cohyponym_auc"] >= 0.65, real  # rare senses included: 0.745, 0.686
    assert len(hits) >= 7, real["neighbours"]
    # The negative control: the same checks on vectors that carry no meaning.
    for kind in ("first_sense_auc", "synonym_auc", "cohyponym_auc"):
        assert abs(shuffled[kind] - 0.5) < 0.05, (kind, shuffled[kind])
    assert len(control_hits) <= 3


def test_roc_auc_against_pairwise_counting(seed):
    rng = np.random.default_rng(seed)
    pos, neg = rng.normal(0.5, 1, 40).round(1), rng.normal(0, 1, 55).round(1)  # rounded: ties occur
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert quality.roc_auc(pos, neg) == pytest.approx(pairs / (len(pos) * len(neg)), abs=1e-12), seed


def make(out, *extra, env=None):
    return subprocess.run([str(SCRIPT), str(out), "--corpus", "wordnet", "--max-sentences", "3000", "--epochs", "1",
                           "--min-count", "2", *map(str, extra)],
                          capture_output=True, text=True, env=dict(os.environ, **(env or {})), timeout=300)


@pytest.mark.skipif(not (WORDNET / "data.noun").exists(), reason="wordnet-base is not installed")
def test_same_seed_same_bytes_and_qkv_reads_every_word(tmp_path, run):
    a, b = make(tmp_path / "a", env={"PYTHONHASHSEED": "1"}), make(tmp_path / "b", env={"PYTHONHASHSEED": "2"})
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert (tmp_path / "a" / "words.txt").read_bytes() == (tmp_path / "b" / "words.txt").read_bytes()
    assert (tmp_path / "a" / "sentences.txt").read_bytes() == (tmp_path / "b" / "sentences.txt").read_bytes()
    c = make(tmp_path / "c", "--seed", "2")
    assert c.returncode == 0, c.stderr
    assert (tmp_path / "c" / "words.txt").read_bytes() != (tmp_path / "a" / "words.txt").read_bytes()
    # Every word the script writes is one qkv's tokenizer produces and finds.
    words = [line.split(" ", 1)[0] for line in (tmp_path / "a" / "words.txt").read_text().splitlines()]
    proc = run("context", "--embeddings", tmp_path / "a" / "words.txt", "--random-weights", "0", " ".join(words[:200]), "--format", "json")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("corpus, option, package", [
    ("gcide", "--gcide", "dict-gcide"),
    ("wordnet", "--wordnet-dir", "wordnet-base"),
])
def test_missing_corpus_names_the_debian_package(tmp_path, corpus, option, package):
    proc = subprocess.run([str(SCRIPT), str(tmp_path / "out"), "--corpus", corpus, option, str(tmp_path / "absent")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"install the Debian package {package}" in proc.stderr and str(tmp_path / "absent") in proc.stderr
    assert not (tmp_path / "out").exists()
