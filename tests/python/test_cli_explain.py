"""`qkv explain`: the seeds' worked examples (numbers recomputed here with numpy from the seeds'
own text) and sentences from generated embeddings, as text and as JSON."""
import ast
import json
import re

import numpy as np
import pytest

from qkv_testlib import layer_forward, softmax, write_layer

# Seed 003's inputs as printed in the seed, used when the seeds directory is not available.
SEED003 = {
    "X": [[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]],
    "W_q": [[0.1, 0.2, 0.0, 0.0], [0.0, 0.1, 0.3, 0.0], [0.1, 0.0, 0.0, 0.2], [0.0, 0.0, 0.2, 0.3]],
    "W_k": [[0.2, 0.0, 0.1, 0.0], [0.0, 0.1, 0.0, 0.3], [0.1, 0.0, 0.2, 0.0], [0.0, 0.2, 0.0, 0.1]],
    "W_v": [[0.0, 0.1, 0.0, 0.2], [0.2, 0.0, 0.2, 0.0], [0.0, 0.3, 0.1, 0.0], [0.1, 0.0, 0.0, 0.3]],
}
SEED000 = {"q1": [0.212, 0.04, 0.63, 0.36], "k1": [0.31, 0.84, 0.963, 0.57], "v1": [0.36, 0.83, 0.1, 0.38],
           "q2": [0.1, 0.14, 0.86, 0.77], "k2": [0.45, 0.94, 0.73, 0.58], "v2": [0.31, 0.36, 0.19, 0.72]}


def seed_text(seeds_dir, prefix):
    files = sorted(seeds_dir.glob(prefix + "_*.txt")) if seeds_dir.is_dir() else []
    return files[0].read_text() if files else None


@pytest.fixture
def seed003(seeds_dir):
    """X, W_q, W_k, W_v parsed from seed 003's numpy code (checked against the copy above)."""
    text = seed_text(seeds_dir, "003")
    if text is None:
        return {k: np.array(v) for k, v in SEED003.items()}
    parsed = {}
    for name in SEED003:
        m = re.search(re.escape(name) + r" = np\.array\(\s*(\[.*?\])\s*\)", text, re.S)
        assert m, f"seed 003 has no {name} = np.array(...)"
        parsed[name] = np.array(ast.literal_eval(re.sub(r"#[^\[\]]*", "", m.group(1))))
        assert np.array_equal(parsed[name], SEED003[name]), name
    return parsed


@pytest.fixture
def seed000(seeds_dir):
    text = seed_text(seeds_dir, "000")
    if text is None:
        return {k: np.array(v) for k, v in SEED000.items()}
    parsed = {}
    for name in SEED000:
        m = re.search(re.escape(name) + r" = \[([^\]]*)\]", text)
        assert m, f"seed 000 has no {name} = [...]"
        parsed[name] = np.array([float(x) for x in m.group(1).split()])
        assert np.array_equal(parsed[name], SEED000[name]), name
    return parsed


def seed003_numpy(s):
    """Seed 003's own code."""
    Q, K, V = s["X"] @ s["W_q"], s["X"] @ s["W_k"], s["X"] @ s["W_v"]
    scores = Q @ K.T
    scaled = scores / np.sqrt(Q.shape[1])
    weights = softmax(scaled)
    return dict(q=Q, k=K, v=V, scores=scores, scaled_scores=scaled, weights=weights, context=weights @ V)


def test_explain_prints_seed003_steps_and_numbers(run, seed003):
    proc = run("explain")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for phrase in ["Project inputs to queries, keys, and values", "Compute attention scores", "scores = Q @ K.T",
                   "Scale the scores", "np.sqrt(d_k)", "Apply the softmax function", "Attention weights:",
                   "Compute the weighted sum of values", "Self-attention output:"]:
        assert phrase in out, phrase
    # Seed 003's own numbers, and every step's numbers recomputed here.
    for number in ["0.31359894", "0.35006362", "0.33633743", "0.3109394", "0.25997455", "0.27228657", "0.44092668"]:
        assert number in out, number
    want = seed003_numpy(seed003)
    for step in ("q", "k", "v", "scores", "scaled_scores", "weights", "context"):
        for row in want[step]:
            line = " ".join(f"{x:.8f}" for x in row)
            assert line in out, f"{step} row {line} missing"
    assert out.index("Compute attention scores") < out.index("Scale the scores") < out.index("Attention weights:")


def test_explain_json_matches_numpy(run, seed003):
    proc = run("explain", "--json")
    assert proc.returncode == 0, proc.stderr
    j = json.loads(proc.stdout)
    want = seed003_numpy(seed003)
    np.testing.assert_array_equal(np.array(j["x"]), seed003["X"])
    np.testing.assert_array_equal(np.array(j["w_q"]), seed003["W_q"])
    np.testing.assert_array_equal(np.array(j["w_k"]), seed003["W_k"])
    np.testing.assert_array_equal(np.array(j["w_v"]), seed003["W_v"])
    assert j["d_k"] == 4 and j["heads"][0]["scale"] == 0.5
    for step, value in want.items():
        np.testing.assert_allclose(np.array(j["heads"][0][step]), value, rtol=1e-12, atol=1e-15, err_msg=step)
    np.testing.assert_allclose(np.array(j["output"]), want["context"], rtol=1e-12)
    np.testing.assert_allclose(np.array(j["output"])[0], [0.3109394, 0.25997455, 0.27228657, 0.44092668], atol=1e-6)
    np.testing.assert_allclose(np.array(j["heads"][0]["weights"])[0], [0.31359894, 0.35006362, 0.33633743], atol=1e-6)


def test_explain_playing_outside_matches_seed000(run, seed000):
    q = np.array([seed000["q1"], seed000["q2"]])
    k = np.array([seed000["k1"], seed000["k2"]])
    v = np.array([seed000["v1"], seed000["v2"]])
    weights = softmax(q @ k.T / np.sqrt(4))
    context = weights @ v
    proc = run("explain", "--example", "playing-outside", "--json")
    assert proc.returncode == 0, proc.stderr
    j = json.loads(proc.stdout)
    assert j["tokens"] == ["Playing", "Outside"]
    np.testing.assert_allclose(np.array(j["heads"][0]["weights"]), weights, rtol=1e-12)
    np.testing.assert_allclose(np.array(j["output"]), context, rtol=1e-12)

    text = run("explain", "--example", "playing-outside")
    assert text.returncode == 0, text.stderr
    assert "Step 1 : Creating Query (Q), Key (K), and Value (V) Vectors" in text.stdout
    assert "Step 4 : Compute the Context Vector" in text.stdout
    for i, word in enumerate(["Playing", "Outside"]):
        # The context vector as seed 000 writes it: a weighted sum of the value vectors.
        sum_text = f'[{weights[i, 0]:.8f} * "Playing" + {weights[i, 1]:.8f} * "Outside"]'
        assert f'Context vector for "{word}": {sum_text}' in text.stdout
        assert f"z{i + 1} = {weights[i, 0]:.8f}·v1 + {weights[i, 1]:.8f}·v2 = [ " \
               + " ".join(f"{x:.8f}" for x in context[i]) + "]" in text.stdout


@pytest.mark.parametrize("fmt", ["glove", "w2v_text", "w2v_bin"])
def test_explain_sentence_parameter_free(run, embeddings, seed, fmt):
    sentence = "Money bank grows"
    proc = run("explain", "--embeddings", getattr(embeddings, fmt), "--parameter-free", "--json", sentence)
    assert proc.returncode == 0, f"seed {seed}: {proc.stderr}"
    j = json.loads(proc.stdout)
    assert j["tokens"] == ["money", "bank", "grows"] and j["parameter_free"] and j["w_q"] is None
    x = embeddings.x(j["tokens"])
    np.testing.assert_array_equal(np.array(j["x"]), x)
    want = softmax(x @ x.T / np.sqrt(x.shape[1])) @ x
    np.testing.assert_allclose(np.array(j["output"]), want, rtol=1e-12, err_msg=f"seed {seed}")


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_explain_sentence_random_weights_are_seeded(run, embeddings, seed, heads):
    sentence = "I went to the bank to deposit money"
    args = ["explain", "--embeddings", embeddings.glove, "--heads", heads, "--seed", seed % 1000, "--json", sentence]
    first, again = run(*args), run(*args)
    assert first.returncode == 0, f"seed {seed}: {first.stderr}"
    assert first.stdout == again.stdout, "the same --seed must give the same W"
    j = json.loads(first.stdout)
    assert j["num_heads"] == heads and len(j["heads"]) == heads
    x = embeddings.x(j["tokens"])
    w = {name: np.array(j[name]) for name in ("w_q", "w_k", "w_v")}
    want = layer_forward(x, w, heads)
    np.testing.assert_allclose(np.array(j["output"]), want, rtol=1e-10, err_msg=f"seed {seed}")
    other = json.loads(run(*args[:6], seed % 1000 + 1, *args[7:]).stdout)
    assert other["w_q"] != j["w_q"], "a different --seed must give different W"


def test_explain_sentence_with_weights_file(run, embeddings, tmp_path, seed):
    rng = np.random.default_rng(seed)
    E = embeddings.matrix.shape[1]
    w = write_layer(tmp_path / "layer.safetensors", rng, E=E, H=2, D=3, Dv=2, kv_heads=1, bias=True)
    proc = run("explain", "--embeddings", embeddings.glove, "--weights", tmp_path / "layer.safetensors", "--json",
               "We sat by the river bank")
    assert proc.returncode == 0, f"seed {seed}: {proc.stderr}"
    j = json.loads(proc.stdout)
    x = embeddings.x(j["tokens"])
    np.testing.assert_allclose(np.array(j["w_o"]), w["w_o"], rtol=0)
    np.testing.assert_allclose(np.array(j["output"]), layer_forward(x, w, 2, 1), rtol=1e-10, err_msg=f"seed {seed}")
    text = run("explain", "--embeddings", embeddings.glove, "--weights", tmp_path / "layer.safetensors",
               "We sat by the river bank")
    assert text.returncode == 0 and "Head 2 of 2" in text.stdout and "Output projection" in text.stdout


@pytest.mark.parametrize("command", ["explain", "context", "compare", "attend"])
def test_every_subcommand_has_help(run, command):
    proc = run(command, "--help")
    assert proc.returncode == 0 and "Usage:" in proc.stdout and proc.stderr == ""
