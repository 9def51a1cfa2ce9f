"""examples/tiny_lm.py at test size: qkv.torch trains the same model as PyTorch's composite attention
(to rounding without dropout), checkpoints resume bit for bit, qkv.KVCache generation equals a
full forward pass, and bad arguments fail with a message."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import qkv

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_lm.py"
spec = importlib.util.spec_from_file_location("tiny_lm", EXAMPLE)
lm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lm)

WORDNET = Path("/usr/share/wordnet")
needs_wordnet = pytest.mark.skipif(not (WORDNET / "data.noun").exists(),
                                   reason="WordNet (Debian's wordnet-base) is not installed")
@pytest.fixture
def rng(seed):
    print(f"seed {seed}: QKV_TEST_SEED={seed} replays it")  # shown when the test fails
    return np.random.default_rng(seed)


TINY = ["--d", "32", "--heads", "2", "--layers", "2", "--tokens", "384", "--threads", "1", "--generate", "0"]


def test_rotary_is_qkv_half_split(rng):
    x = rng.standard_normal((7, 3, 16)).astype(np.float32)  # [T, H, D]
    cos, sin = lm.rotary_tables(torch.arange(7), 16)
    got = lm.rotate(torch.from_numpy(x), cos, sin).numpy()
    want = qkv.apply_rotary(x.transpose(1, 0, 2), 0, layout="half_split").transpose(1, 0, 2)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_packed_batch_positions_restart_per_sentence():
    x, y, cu, longest = lm.packed_batch(["abc", "hello world", "xy"], 40, seed=3, step=0)
    assert x.shape == y.shape and int(cu[-1]) == len(x) and len(x) >= 40
    pos, seq = lm.positions_of(cu)
    starts = cu[:-1].long()
    assert (x[starts] == lm.BOS).all() and (pos[starts] == 0).all()
    assert (y[cu[1:].long() - 1] == lm.EOS).all()
    assert longest == int((cu[1:] - cu[:-1]).max())
    again = lm.packed_batch(["abc", "hello world", "xy"], 40, seed=3, step=0)
    assert torch.equal(again[0], x)


def test_composite_attention_is_per_sentence_causal(rng):
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    q, k, v = (torch.from_numpy(rng.standard_normal((13, 2, 8)).astype(np.float32)) for _ in range(3))
    got = lm.composite_attention(q, k, v, (*lm.positions_of(cu), lm.padding(cu, 7)), 0.0)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (t[a:b].transpose(0, 1).double() for t in (q, k, v))
        s = qs @ ks.transpose(-1, -2) / 8 ** 0.5
        s = s.masked_fill(torch.ones(b - a, b - a).triu(1).bool(), float("-inf"))
        np.testing.assert_allclose(got[a:b].numpy(), (s.softmax(-1) @ vs).transpose(0, 1).numpy(), atol=1e-6)
    want = qkv.torch.varlen_attention(q, k, v, cu, cu, 7, 7, causal=True)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=2e-6)


@needs_wordnet
def test_wordnet_sentences():
    sentences = lm.wordnet_sentences()
    assert len(sentences) > 100_000
    assert any(s.startswith("bank: sloping land") for s in sentences)
    assert all(16 <= len(s) <= 200 and s.isascii() for s in sentences)
    train, held = lm.split_sentences(sentences)
    assert len(held) == -(-len(sentences) // 50) and not set(held) & set(train[:1000]) - set(held)


@needs_wordnet
def test_without_dropout_qkv_trains_as_the_composite(capsys):
    report = lm.main(TINY + ["--dropout", "0", "--steps", "12", "--eval-every", "6", "--lr", "1e-2", "--seeds", "3"])
    a, b = report["runs"]["qkv"], report["runs"]["torch"]
    assert a["train_loss"][-1] < a["train_loss"][0] - 0.5, a["train_loss"]
    np.testing.assert_allclose(a["train_loss"], b["train_loss"], rtol=2e-5)
    np.testing.assert_allclose([e[1] for e in a["eval_loss"]], [e[1] for e in b["eval_loss"]], rtol=2e-5)
    assert set(report["runs"]) == {"qkv", "torch"}
    assert "held-out loss, qkv vs composite" in capsys.readouterr().out


@needs_wordnet
def test_with_dropout_both_learn_and_the_noise_is_measured():
    report = lm.main(TINY + ["--dropout", "0.1", "--steps", "12", "--eval-every", "6", "--lr", "1e-2", "--seeds", "3"])
    runs = report["runs"]
    assert set(runs) == {"qkv", "torch", "qkv-1", "torch-1", "qkv-2", "torch-2"}
    for r in runs.values():
        assert r["eval_loss"][-1][1] < np.log(lm.VOCAB) - 1.0 and np.isfinite(r["train_loss"]).all()
    assert runs["qkv"]["train_loss"] != runs["torch"]["train_loss"]  # different masks, different curves
    assert runs["qkv"]["train_loss"] != runs["qkv-1"]["train_loss"]
    c = report["comparison"]
    assert c["qkv_vs_torch_max"] < 0.5 and len(c["final_held_out"]["qkv"]) == 3 and c["t95"] > 1.9
    assert c["within_noise"] == (abs(c["welch_t"]) <= c["t95"])


@needs_wordnet
def test_resume_continues_bit_for_bit(tmp_path):
    ckpt = str(tmp_path / "lm.pt")
    args = TINY + ["--dropout", "0.1", "--eval-every", "3"]
    whole = lm.main(args + ["--steps", "6"])
    lm.main(args + ["--steps", "3", "--checkpoint", ckpt])
    resumed = lm.main(["--resume", ckpt, "--steps", "6", "--threads", "1", "--generate", "0"])
    for name in whole["runs"]:
        assert resumed["runs"][name]["train_loss"] == whole["runs"][name]["train_loss"], name
        assert resumed["runs"][name]["eval_loss"] == whole["runs"][name]["eval_loss"], name


def _greedy_full_forward(model, prompts, new_tokens):
    """Greedy decoding by re-running the whole model on each sequence at every step (no cache)."""
    model.eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = [lm.BOS, *p.encode("ascii")]
            longest = max(len(q) for q in prompts) + 1 + new_tokens
            while len(ids) < longest:
                logits = model(torch.tensor(ids), torch.tensor([0, len(ids)], dtype=torch.int32), len(ids))
                ids.append(int(logits[-1].argmax()))
            out.append(bytes(ids[1:]).decode("ascii", "replace").split("\n")[0])
    return out


def test_generation_with_qkv_cache_equals_the_torch_cache_and_the_full_forward():
    torch.manual_seed(5)
    model = lm.TinyLM(d=32, heads=2, layers=2, dropout=0.1)
    with torch.no_grad():  # large weights so greedy choices are not near-ties
        for p in model.parameters():
            p.mul_(3.0)
    prompts = ["bank: ", "the river", "x"]
    got, _ = lm.generate(model, prompts, 12, "qkv", page_tokens=4)
    assert got == lm.generate(model, prompts, 12, "torch")[0]
    assert got == _greedy_full_forward(model, prompts, 12)


def _run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--dropout", "1.5"], "--dropout must be in [0, 1), got 1.5"),
    (["--d", "30", "--heads", "4"], "--d 30 must be a multiple of --heads 4"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--seeds", "0"], "--seeds must be at least 1"),
])
def test_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exit:
        lm.parse_args(args)
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_missing_wordnet(tmp_path):
    r = _run("--wordnet", str(tmp_path), "--steps", "1")
    assert r.returncode == 1 and "WordNet's data files are missing" in r.stderr and "wordnet-base" in r.stderr
