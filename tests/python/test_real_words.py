"""Real words out of the box (docs/guide.md, "Real words"): the default word vectors, `qkv train --task
masked-word`, sinusoidal positions in `explain`, and an explainer that does not mislead (weights
labelled by origin, 1-based token numbers, file names only, did-you-mean for options)."""
import csv
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from qkv_testlib import VOCABULARY, EmbeddingFiles


def qkv(qkv_bin, *args, env=None, cwd=None, timeout=600):
    return subprocess.run([qkv_bin, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def ok(proc):
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def built_words(qkv_bin):
    path = Path(qkv_bin).parent / "data" / "words.txt"
    if not path.exists():
        pytest.skip(f"{path} not built (it takes minutes): `make demo` or `cmake --build build --target embeddings`")
    return path


# ---- the default word vectors ----

def test_sentence_commands_find_the_built_vectors_without_flags(qkv_bin, built_words):
    env = {k: v for k, v in os.environ.items() if k != "QKV_EMBEDDINGS"}
    p = subprocess.run([qkv_bin, "explain", "we sat by the river bank"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert "embeddings from words.txt (width " in p.stdout and str(built_words.parent) not in p.stdout
    p = subprocess.run([qkv_bin, "compare", "--word", "bank", "I went to the bank to deposit money",
                        "we sat by the river bank"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert "static cosine similarity:     1.000000" in p.stdout
    assert "the trained layer context-layer.safetensors" in p.stdout and "qkv train --task context" in p.stdout


def test_without_the_trained_layer_the_commands_say_how_to_get_it(qkv_bin, embeddings, tmp_path):
    """Other word vectors have no trained layer: a usage error naming the ways forward, never a
    silent random layer."""
    for args in (["explain", "river bank"], ["context", "river bank"],
                 ["compare", "--word", "bank", "river bank", "the bank"]):
        p = qkv(qkv_bin, *args, "--embeddings", embeddings.glove, cwd=tmp_path)
        assert p.returncode == 1, (args, p.stderr)
        assert "--random-weights SEED" in p.stderr and "--parameter-free" in p.stderr, p.stderr
        assert "qkv train --task context" in p.stderr, p.stderr


def test_qkv_embeddings_variable_and_its_empty_form(qkv_bin, embeddings, tmp_path):
    p = ok(qkv(qkv_bin, "explain", "river bank", "--random-weights", "0", "--json",
               env={"QKV_EMBEDDINGS": str(embeddings.glove)}))
    x = np.array(json.loads(p.stdout)["x"])
    assert np.array_equal(x, embeddings.x(["river", "bank"]))
    for args in (["explain", "river bank"], ["compare", "--word", "bank", "river bank", "the bank"],
                 ["context", "river bank"], ["train", "--task", "masked-word"]):
        (tmp_path / "cwd").mkdir(exist_ok=True)
        p = qkv(qkv_bin, *args, env={"QKV_EMBEDDINGS": ""}, cwd=tmp_path / "cwd")
        assert p.returncode == 2, (args, p.stderr)
        assert "no word vectors: pass --embeddings F, set QKV_EMBEDDINGS=F, or build the default" in p.stderr
        assert "make demo" in p.stderr and os.listdir(tmp_path / "cwd") == []


# ---- the masked-word task ----

def pattern_corpus(path, rng, lines=3000):
    """Sentences whose every word is predictable from its neighbours' identities: the word after
    `river` is `bank`, after `deposit` comes `money`, otherwise random filler."""
    pairs = [("river", "bank"), ("deposit", "money"), ("piece", "cake"), ("play", "outside")]
    filler = [w for w in VOCABULARY if w not in {w for p in pairs for w in p}]
    with open(path, "w") as f:
        for _ in range(lines):
            words = list(rng.choice(filler, size=int(rng.integers(2, 6))))
            a, b = pairs[int(rng.integers(0, len(pairs)))]
            at = int(rng.integers(0, len(words) + 1))
            f.write(" ".join(words[:at] + [a, b] + words[at:]) + "\n")


def parse_accuracies(stdout):
    rows = dict(re.findall(r"^  (trained layer|mean of the context vectors|parameter-free \(Q = K = V = X\)|"
                           r"untrained layer \(its seed\))\s+([\d.]+)%\s+[\d.]+%$", stdout, re.M))
    assert len(rows) == 4, stdout
    return {k.split(" ")[0]: float(v) for k, v in rows.items()}


def test_masked_word_learns_what_the_baselines_cannot(qkv_bin, tmp_path, seed):
    rng = np.random.default_rng(seed)
    embeddings = EmbeddingFiles(tmp_path, rng, dim=32)  # 6 dimensions cannot tell 35 words apart by dot product
    pattern_corpus(tmp_path / "s.txt", rng)
    p = ok(qkv(qkv_bin, "train", "--task", "masked-word", "--embeddings", embeddings.glove, "--sentences",
               tmp_path / "s.txt", "--steps", "300", "--heads", "2", "--min-length", "3", "--seed", seed % 1000,
               "--save", tmp_path / "w.safetensors", "--loss-csv", tmp_path / "loss.csv", "--loss-svg",
               tmp_path / "loss.svg", "--eval-examples", "400"))
    acc = parse_accuracies(p.stdout)
    assert acc["trained"] >= acc["mean"] + 10 and acc["trained"] >= acc["parameter-free"] + 10, (seed, p.stdout)
    rows = list(csv.DictReader(open(tmp_path / "loss.csv")))
    assert [int(r["step"]) for r in rows] == list(range(1, 301))
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"]) - 0.5, (seed, rows[0], rows[-1])
    svg = ET.parse(tmp_path / "loss.svg").getroot()
    points = svg.find("{http://www.w3.org/2000/svg}polyline").get("points").split()
    assert len(points) == 300
    texts = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    assert "training step" in texts and "cross-entropy loss" in texts
    # The saved layer explains real sentences and is labelled as learned, by file name only.
    p = ok(qkv(qkv_bin, "explain", "--embeddings", embeddings.glove, "--weights", tmp_path / "w.safetensors",
               "we sat by the river bank"))
    assert "learned (w.safetensors)" in p.stdout and str(tmp_path) not in p.stdout


@pytest.mark.parametrize("args, needle", [
    (["--pairs", "3"], "--pairs applies only to --task lookup"),
    (["--checkpoint", "c.st"], "--checkpoint applies only to --task lookup"),
])
def test_masked_word_refuses_lookup_options(qkv_bin, embeddings, tmp_path, args, needle):
    p = qkv(qkv_bin, "train", "--task", "masked-word", "--embeddings", embeddings.glove, *args, cwd=tmp_path)
    assert p.returncode == 2 and needle in p.stderr, p.stderr


def test_lookup_refuses_masked_word_options(qkv_bin, tmp_path):
    p = qkv(qkv_bin, "train", "--positions", cwd=tmp_path)
    assert p.returncode == 2 and "--positions applies only to --task masked-word" in p.stderr, p.stderr


def test_masked_word_bad_corpora(qkv_bin, embeddings, tmp_path):
    p = qkv(qkv_bin, "train", "--task", "masked-word", "--embeddings", embeddings.glove, "--sentences",
            tmp_path / "absent.txt", cwd=tmp_path)
    assert p.returncode == 1 and "--sentences FILE" in p.stderr and "cannot open" in p.stderr \
        and "absent.txt" in p.stderr, p.stderr
    # A stream without end, or a FIFO nobody writes: refused at once (both were read or waited on forever).
    os.mkfifo(tmp_path / "fifo")
    for path in ("/dev/zero", tmp_path / "fifo"):
        p = qkv(qkv_bin, "train", "--task", "masked-word", "--embeddings", embeddings.glove, "--sentences", path,
                cwd=tmp_path, timeout=30)
        assert p.returncode == 1 and "not a regular file" in p.stderr and str(path) in p.stderr, p.stderr
    (tmp_path / "s.txt").write_text("zzz qqq xxx yyy\nriver bank\n")
    p = qkv(qkv_bin, "train", "--task", "masked-word", "--embeddings", embeddings.glove, "--sentences",
            tmp_path / "s.txt", cwd=tmp_path)
    assert p.returncode == 1 and "s.txt: no usable training sentence (4 to 16 words" in p.stderr, p.stderr
    # Every usable sentence left out by --exclude: the message says so.
    (tmp_path / "same.txt").write_text("the river bank grows\n" * 200)
    (tmp_path / "ex.txt").write_text("the river bank grows\n")
    p = qkv(qkv_bin, "train", "--task", "context", "--embeddings", embeddings.glove, "--sentences",
            tmp_path / "same.txt", "--exclude", tmp_path / "ex.txt", cwd=tmp_path)
    assert p.returncode == 1 and "no usable training sentence" in p.stderr, p.stderr
    assert "--exclude left out 200 usable ones" in p.stderr, p.stderr
    # Too few lines for one to be held out: the message says how held-out lines are chosen.
    (tmp_path / "few.txt").write_text("the river bank grows\n" * 3)
    p = qkv(qkv_bin, "train", "--task", "masked-word", "--embeddings", embeddings.glove, "--sentences",
            tmp_path / "few.txt", cwd=tmp_path)
    assert p.returncode == 1 and "no usable held-out sentence" in p.stderr, p.stderr
    assert "about one line in 20 is held out" in p.stderr, p.stderr


# ---- positions ----

def test_positions_make_word_order_matter_and_follow_the_formula(qkv_bin, embeddings):
    def run(sentence, *extra):
        p = ok(qkv(qkv_bin, "explain", "--embeddings", embeddings.glove, sentence, "--heads", "2", "--json", *extra))
        return json.loads(p.stdout)
    fwd, rev = run("we sat by the river"), run("river the by sat we")
    assert np.allclose(np.array(fwd["output"]), np.array(rev["output"])[::-1], atol=1e-6)  # no positions: permuted
    fwd, rev = run("we sat by the river", "--positions"), run("river the by sat we", "--positions")
    assert not np.allclose(np.array(fwd["output"]), np.array(rev["output"])[::-1], atol=1e-3)
    E = embeddings.matrix.shape[1]
    pos, col = np.arange(5)[:, None], np.arange(E)[None, :]
    angle = pos / np.power(10000.0, (col - col % 2) / E)
    pe = np.where(col % 2 == 0, np.sin(angle), np.cos(angle))
    want = (embeddings.x("we sat by the river".split()) + pe).astype(np.float32)
    assert np.array_equal(np.array(fwd["x"], dtype=np.float32), want)
    assert "plus sinusoidal positional encodings" in fwd["source"]


# ---- an explainer that does not mislead ----

def test_weights_are_labelled_by_where_they_come_from(qkv_bin, embeddings, tmp_path):
    p = ok(qkv(qkv_bin, "explain", "--embeddings", embeddings.glove, "river bank", "--seed", "7"))
    assert "Weight matrices (random (seed 7);" in p.stdout and "learned" not in p.stdout
    ok(qkv(qkv_bin, "explain", "--embeddings", embeddings.glove, "river bank", "--seed", "7", "--html", tmp_path / "p.html"))
    page = (tmp_path / "p.html").read_text()
    assert "random (seed 7): query projection" in page and "learned" not in page
    assert str(tmp_path) not in page and "glove.txt" in page
    p = ok(qkv(qkv_bin, "explain"))
    assert "given by seed 003" in p.stdout and "learned" not in p.stdout


def test_token_numbers_are_one_based_everywhere(qkv_bin, embeddings, tmp_path):
    ok(qkv(qkv_bin, "explain", "--embeddings", embeddings.glove, "--random-weights", "0", "we sat by the river bank",
           "--html", tmp_path / "e.html"))
    page = (tmp_path / "e.html").read_text()
    assert '<option value="5">token 6 of 6: bank</option>' in page
    assert '<th>query \\ key</th><th>we</th><th>sat</th>' in page  # score and weight tables name their columns
    ok(qkv(qkv_bin, "compare", "--embeddings", embeddings.glove, "--random-weights", "0", "--word", "bank",
           "I went to the bank", "we sat by the river bank", "--html", tmp_path / "c.html"))
    page = (tmp_path / "c.html").read_text()
    assert '"bank" is token 5 of 5.' in page and '"bank" is token 6 of 6.' in page


def test_heatmap_svg_has_axis_titles(qkv_bin, embeddings, tmp_path):
    ok(qkv(qkv_bin, "explain", "--embeddings", embeddings.glove, "--random-weights", "0", "we sat by the river bank",
           "--svg", tmp_path / "h.svg"))
    texts = [t.text for t in ET.parse(tmp_path / "h.svg").getroot().iter("{http://www.w3.org/2000/svg}text")]
    assert "keys (columns): the tokens attended to" in texts and "queries (rows): the tokens attending" in texts


@pytest.mark.parametrize("args, message", [
    ([], "qkv: no subcommand given; see `qkv --help` (or try `qkv explain`)"),
    (["explain", "--head", "2", "river bank"], "qkv: unknown option --head (did you mean --heads?)"),
    (["train", "--step", "3"], "qkv: unknown option --step (did you mean --steps?)"),
    (["explain", "--frobnicate", "x"], "qkv: unknown option --frobnicate (see qkv explain --help)"),
])
def test_usage_messages_point_the_way(qkv_bin, tmp_path, args, message):
    p = qkv(qkv_bin, *args, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.strip() == message, p.stderr


@pytest.mark.parametrize("content", ['{"bank": [0.1, 0.2]}\n', "hello world\n", "<html><body>bank</body></html>\n"])
def test_a_file_that_is_not_embeddings_says_so(qkv_bin, tmp_path, content):
    (tmp_path / "e.txt").write_text(content)
    p = qkv(qkv_bin, "explain", "--embeddings", tmp_path / "e.txt", "--random-weights", "0", "river bank", cwd=tmp_path)
    assert p.returncode == 1 and "this is not a GloVe or word2vec file" in p.stderr, p.stderr


def test_help_says_once_what_the_seed_names_mean(qkv_bin):
    p = ok(qkv(qkv_bin, "--help"))
    assert "seed 003 \"How Self-Attention Is Calculated\"" in p.stdout and "`--seed` is a random seed" in p.stdout


def test_masked_word_training_is_reproducible_and_compare_names_what_bank_attends_to(qkv_bin, tmp_path, seed):
    rng = np.random.default_rng(seed)
    embeddings = EmbeddingFiles(tmp_path, rng, dim=16)
    pattern_corpus(tmp_path / "s.txt", rng, lines=600)
    for name in ("a", "b"):
        ok(qkv(qkv_bin, "train", "--task", "masked-word", "--embeddings", embeddings.glove, "--sentences",
               tmp_path / "s.txt", "--steps", "40", "--min-length", "3", "--save", tmp_path / f"{name}.safetensors",
               "--eval-examples", "50"))
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    p = ok(qkv(qkv_bin, "compare", "--embeddings", embeddings.glove, "--weights", tmp_path / "a.safetensors",
               "--word", "bank", "I went to the bank to deposit money", "we sat by the river bank"))
    for n, sentence in ((1, "i went to the bank to deposit money"), (2, "we sat by the river bank")):
        block = p.stdout.split(f'"bank" in sentence {n}:\n')[1]
        for h in (1, 2):
            line = block.splitlines()[h - 1]
            assert line.startswith(f"  head {h} attends to: "), line
            entries = re.findall(r"(\w+) \(token (\d+)\) ([\d.]+)", line)
            assert len(entries) == 4 and all(sentence.split()[int(t) - 1] == w for w, t, _ in entries), line
            assert [float(x) for _, _, x in entries] == sorted((float(x) for _, _, x in entries), reverse=True)
    assert "learned weights from a.safetensors, 2 heads" in p.stdout


def test_text_tables_of_a_sentence_name_their_key_columns(qkv_bin, embeddings):
    p = ok(qkv(qkv_bin, "explain", "--embeddings", embeddings.glove, "we sat by the river bank", "--parameter-free"))
    for table in ("scores", "scaled_scores", "attention_weights"):
        block = p.stdout.split(f"  {table} [6 x 6]:\n")[1].splitlines()
        assert block[0].split() == ["we", "sat", "by", "the", "river", "bank"], block[0]
        assert block[1].split()[0] == "we" and block[6].split()[0] == "bank"
