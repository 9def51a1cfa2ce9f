"""`qkv attend` against an independent numpy attention (qkv_testlib.attention) on random cases:
GQA, cross-attention, odd sizes, every mask kind and their combinations, float64 end to end."""
import os
import subprocess

import numpy as np
import pytest

from qkv_testlib import attention

CASES = 240
HEAD_DIMS = [1, 3, 40, 59, 64, 111, 128]
# Shapes (as functions of B, H, N, M) that broadcast to [B, H, N, M] by numpy rules.
MASK_SHAPES = [
    lambda B, H, N, M: (B, H, N, M),
    lambda B, H, N, M: (B, 1, N, M),
    lambda B, H, N, M: (1, H, N, M),
    lambda B, H, N, M: (N, M),
    lambda B, H, N, M: (1, 1, 1, M),
    lambda B, H, N, M: (H, N, 1),
    lambda B, H, N, M: (M,),
]


def f32(x):
    """A float that float32 holds exactly (the CLI stores slopes, softcap and bias as float32)."""
    return float(np.float32(x))


def make_case(rng):
    B = int(rng.integers(1, 4))
    Hkv = int(rng.choice([1, 2, 3]))
    H = Hkv * int(rng.choice([1, 2, 3]))
    N = int(rng.choice([1, 2, 3, 5, 7, 8, 13, 16]))
    M = int(rng.choice([1, 2, 3, 4, 7, 9, 16]))
    D = int(rng.choice(HEAD_DIMS))
    Dv = int(rng.choice([1, 3, 8, D]))
    magnitude = rng.uniform(0.1, 2.0)
    case = dict(q=rng.standard_normal((B, H, N, D)) * magnitude, k=rng.standard_normal((B, Hkv, M, D)) * magnitude,
                v=rng.standard_normal((B, Hkv, M, Dv)), args=[], ref={})
    rank = 4
    if B == 1 and rng.random() < 0.5:
        rank = 2 if H == 1 and Hkv == 1 else 3
    case["rank"] = rank
    p = 0.35
    if rng.random() < p:
        align = str(rng.choice(["top_left", "bottom_right"]))
        case["args"].append("--causal" if align == "top_left" and rng.random() < 0.5 else f"--causal={align}")
        case["ref"]["causal"] = align
    elif rng.random() < 0.5:
        align = str(rng.choice(["top_left", "bottom_right"]))
        case["args"] += ["--diagonal", align]
        case["ref"]["diagonal"] = align
    if rng.random() < p:
        window = (int(rng.integers(-1, 5)), int(rng.integers(-1, 5)))
        case["args"].append(f"--window={window[0]},{window[1]}")
        case["ref"]["window"] = window
    if rng.random() < p:
        lengths = [int(x) for x in rng.integers(0, M + 1, size=B)]
        case["args"] += ["--key-lengths", ",".join(map(str, lengths))]
        case["ref"]["key_lengths"] = lengths
    if rng.random() < p:
        lengths = [int(x) for x in rng.integers(0, N + 1, size=B)]
        case["args"] += ["--query-lengths", ",".join(map(str, lengths))]
        case["ref"]["query_lengths"] = lengths
    if rng.random() < p:
        shape = MASK_SHAPES[rng.integers(len(MASK_SHAPES))](B, H, N, M)
        case["keep"] = rng.random(shape) < 0.75
    if rng.random() < p:
        shape = MASK_SHAPES[rng.integers(len(MASK_SHAPES))](B, H, N, M)
        bias = rng.standard_normal(shape).astype(np.float32)
        bias[rng.random(shape) < 0.05] = -np.inf
        case["bias"] = bias
    if rng.random() < p:
        slopes = [f32(s) for s in rng.uniform(0.0, 1.0, size=H)]
        case["args"] += ["--alibi-slopes", ",".join(repr(s) for s in slopes)]
        case["ref"]["alibi"] = slopes
    if rng.random() < p:
        cap = f32(rng.uniform(0.5, 10.0))
        case["args"] += ["--softcap", repr(cap)]
        case["ref"]["softcap"] = cap
    if rng.random() < 0.2:
        scale = float(rng.uniform(0.05, 1.0))
        case["args"] += ["--scale", repr(scale)]
        case["ref"]["scale"] = scale
    return case


def squeeze(a, rank):
    """Drops the leading [B, H] dims the way a rank-2 or rank-3 input has them."""
    return a.reshape(a.shape[4 - rank:]) if rank < 4 else a


def max_relative_error(got, want):
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want), initial=0.0)), 1e-300))


def run_case(run, tmp_path, case, extra=(), dtype=np.float64):
    rank = case["rank"]
    files = {}
    for name in ("q", "k", "v"):
        files[name] = tmp_path / f"{name}.npy"
        np.save(files[name], squeeze(case[name], rank).astype(dtype))
    args = ["attend", "--q", files["q"], "--k", files["k"], "--v", files["v"], "--out", tmp_path / "out.npy",
            "--lse", tmp_path / "lse.npy", "--weights", tmp_path / "weights.npy", *case["args"], *extra]
    if "keep" in case:
        np.save(tmp_path / "keep.npy", case["keep"])
        args += ["--keep-mask", tmp_path / "keep.npy"]
    if "bias" in case:
        np.save(tmp_path / "bias.npy", case["bias"])
        args += ["--bias", tmp_path / "bias.npy"]
    return run(*args)


@pytest.mark.parametrize("index", range(CASES))
def test_attend_matches_numpy_float64(run, tmp_path, seed, index):
    rng = np.random.default_rng(seed)
    case = make_case(rng)
    shapes = {n: case[n].shape for n in ("q", "k", "v")}
    context = f"seed {seed} (QKV_TEST_SEED replays), shapes {shapes}, rank {case['rank']}, args {case['args']}, " \
              f"keep {case.get('keep', np.zeros(0)).shape if 'keep' in case else None}, " \
              f"bias {case['bias'].shape if 'bias' in case else None}"
    proc = run_case(run, tmp_path, case, extra=["--kernel", "reference"])
    assert proc.returncode == 0, f"{context}: {proc.stderr}"
    want_out, want_lse, want_w = attention(case["q"], case["k"], case["v"], keep=case.get("keep"),
                                           bias=case.get("bias"), **case["ref"])
    out, lse, weights = (np.load(tmp_path / f) for f in ("out.npy", "lse.npy", "weights.npy"))
    rank = case["rank"]
    for name, got in (("out", out), ("lse", lse), ("weights", weights)):
        assert got.dtype == np.float64, f"{context}: {name} is {got.dtype}"
    assert out.shape == squeeze(want_out, rank).shape, context
    assert lse.shape == (want_lse.shape[4 - rank:] if rank < 4 else want_lse.shape), context
    want_out, want_w = squeeze(want_out, rank), squeeze(want_w, rank)
    want_lse = want_lse.reshape(lse.shape)

    assert max_relative_error(out, want_out) <= 1e-6, f"{context}: out error {max_relative_error(out, want_out)}"
    assert max_relative_error(weights, want_w) <= 1e-6, f"{context}: weights differ"
    masked = np.isneginf(want_lse)
    assert np.array_equal(np.isneginf(lse), masked), f"{context}: lse -inf rows differ"
    assert not np.isnan(lse).any(), context
    if (~masked).any():
        assert max_relative_error(lse[~masked], want_lse[~masked]) <= 1e-6, f"{context}: lse differs"
    # Fully masked rows: exact zeros, never NaN.
    assert np.all(out[masked] == 0.0) and np.all(weights[masked] == 0.0), context


@pytest.mark.parametrize("kernel", ["auto", "fused", "reference"])
@pytest.mark.parametrize("index", range(8))
def test_attend_float32_close_to_numpy(run, tmp_path, seed, index, kernel):
    rng = np.random.default_rng(seed)
    case = make_case(rng)
    context = f"seed {seed}, shapes {case['q'].shape} {case['k'].shape} {case['v'].shape}, args {case['args']}"
    proc = run_case(run, tmp_path, case, extra=["--kernel", kernel, "--threads", "2"], dtype=np.float32)
    assert proc.returncode == 0, f"{context}: {proc.stderr}"
    q, k, v = (case[n].astype(np.float32).astype(np.float64) for n in ("q", "k", "v"))
    want_out, want_lse, want_w = attention(q, k, v, keep=case.get("keep"), bias=case.get("bias"), **case["ref"])
    out, lse, weights = (np.load(tmp_path / f) for f in ("out.npy", "lse.npy", "weights.npy"))
    assert out.dtype == np.float32 and lse.dtype == np.float32 and weights.dtype == np.float32, context
    assert max_relative_error(out, squeeze(want_out, case["rank"])) <= 1e-4, context
    # Weights are recomputed exactly (float64 from the fp32 inputs), then rounded to fp32.
    assert max_relative_error(weights, squeeze(want_w, case["rank"])) <= 1e-6, context
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse.reshape(lse.shape))), context


def test_fully_masked_rows_give_zeros_and_minus_infinity(run, tmp_path, seed):
    rng = np.random.default_rng(seed)
    B, H, N, M, D = 2, 2, 3, 4, 5
    for name, shape in (("q", (B, H, N, D)), ("k", (B, H, M, D)), ("v", (B, H, M, D))):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(shape))
    keep = np.ones((N, M), dtype=bool)
    keep[1] = False  # query row 1 may attend nothing
    np.save(tmp_path / "keep.npy", keep)
    proc = run("attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
               "--key-lengths", "0,4", "--keep-mask", tmp_path / "keep.npy", "--kernel", "reference",
               "--out", tmp_path / "out.npy", "--lse", tmp_path / "lse.npy", "--weights", tmp_path / "w.npy")
    assert proc.returncode == 0, f"seed {seed}: {proc.stderr}"
    out, lse, w = np.load(tmp_path / "out.npy"), np.load(tmp_path / "lse.npy"), np.load(tmp_path / "w.npy")
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0])) and np.all(w[0] == 0), f"seed {seed}"
    assert np.all(out[1, :, 1] == 0) and np.all(np.isneginf(lse[1, :, 1])), f"seed {seed}"
    assert np.all(np.isfinite(lse[1, :, [0, 2]])) and not np.isnan(out).any(), f"seed {seed}"
    # The same through the float32 path.
    proc = run("attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
               "--key-lengths", "0,4", "--out", tmp_path / "o32.npy", "--lse", tmp_path / "l32.npy")
    assert proc.returncode == 0, proc.stderr
    assert np.all(np.load(tmp_path / "o32.npy")[0] == 0) and np.all(np.isneginf(np.load(tmp_path / "l32.npy")[0]))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_zero_queries_give_an_empty_output(run, tmp_path, seed, dtype):
    rng = np.random.default_rng(seed)
    np.save(tmp_path / "q.npy", np.zeros((0, 3), dtype=dtype))
    np.save(tmp_path / "k.npy", rng.standard_normal((4, 3)).astype(dtype))
    np.save(tmp_path / "v.npy", rng.standard_normal((4, 5)).astype(dtype))
    proc = run("attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
               "--kernel", "reference", "--out", tmp_path / "out.npy", "--lse", tmp_path / "lse.npy")
    assert proc.returncode == 0, proc.stderr
    assert np.load(tmp_path / "out.npy").shape == (0, 5)
    assert np.load(tmp_path / "lse.npy").shape == (0,)


def test_zero_keys_mask_every_row(run, tmp_path, seed):
    rng = np.random.default_rng(seed)
    np.save(tmp_path / "q.npy", rng.standard_normal((3, 2)))
    np.save(tmp_path / "k.npy", np.zeros((0, 2)))
    np.save(tmp_path / "v.npy", np.zeros((0, 4)))
    proc = run("attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
               "--kernel", "reference", "--out", tmp_path / "out.npy", "--lse", tmp_path / "lse.npy")
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(tmp_path / "out.npy"), np.zeros((3, 4)))
    assert np.all(np.isneginf(np.load(tmp_path / "lse.npy")))


@pytest.mark.parametrize("kernel", ["auto", "fused"])
def test_attend_float32_same_bytes_for_any_thread_count(run, tmp_path, seed, kernel):
    rng = np.random.default_rng(seed)
    for name, shape in (("q", (2, 4, 37, 64)), ("k", (2, 2, 45, 64)), ("v", (2, 2, 45, 24))):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(shape).astype(np.float32))
    outputs = []
    for threads in ("1", "2", "3"):
        out = tmp_path / f"out{threads}.npy"
        proc = run("attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
                   "--causal=bottom_right", "--kernel", kernel, "--threads", threads, "--out", out)
        assert proc.returncode == 0, f"seed {seed}: {proc.stderr}"
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1] == outputs[2], f"seed {seed}: results depend on the thread count"


@pytest.mark.parametrize("keys", ["64", "128"])
def test_either_key_block_of_the_fp32_forward_keeps_the_fp32_rule(qkv_bin, tmp_path, seed, keys):
    """QKV_KEY_BLOCK picks the fp32 forward's keys per block on any CPU (the default is chosen per
    CPU): either one, over keys that span several blocks and a causal band, is within the fp32 rule
    of float64 attention, with the same bits for one and two threads."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(1, 2, 200, 64), (1, 2, 300, 64), (1, 2, 300, 40)])
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", x)
    env = dict(os.environ, QKV_KEY_BLOCK=keys)
    outs = []
    for threads in ("1", "2"):
        out = tmp_path / f"out{threads}.npy"
        proc = subprocess.run([qkv_bin, "attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v",
                               tmp_path / "v.npy", "--causal", "--out", out, "--threads", threads],
                              capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, f"seed {seed}: {proc.stderr}"
        outs.append(np.load(out))
    want, _, _ = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal="top_left")
    assert np.abs(outs[0] - want).max() <= 2e-5 * (1 + np.abs(want).max()), f"seed {seed}"
    assert outs[0].tobytes() == outs[1].tobytes(), f"seed {seed}: the bits depend on the threads"


def test_another_key_block_is_refused_by_name(qkv_bin, tmp_path):
    for name, shape in (("q", (3, 8)), ("k", (5, 8)), ("v", (5, 8))):
        np.save(tmp_path / f"{name}.npy", np.ones(shape, np.float32))
    env = dict(os.environ, QKV_KEY_BLOCK="96")
    proc = subprocess.run([qkv_bin, "attend", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v",
                           tmp_path / "v.npy", "--out", tmp_path / "out.npy"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stderr == ("qkv: error: QKV_KEY_BLOCK must be 64 or 128 (keys per block of the fp32 forward), "
                           "got '96'\n"), proc.stderr
    assert not (tmp_path / "out.npy").exists()
