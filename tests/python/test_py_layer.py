"""qkv.MultiHeadAttention against torch.nn.MultiheadAttention loaded with the same weights."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import qkv
from py_oracle import assert_close, rng_for, seed_note, torch_attention


TOL = 2e-5


def _torch_mha(layer):
    """A torch.nn.MultiheadAttention (batch_first) carrying `layer`'s weights (transposed)."""
    E, H = layer.embed_dim, layer.num_heads
    mha = torch.nn.MultiheadAttention(E, H, bias=layer.bias, batch_first=True).double()
    with torch.no_grad():
        w = np.concatenate([layer.w_q.T, layer.w_k.T, layer.w_v.T], axis=0)
        mha.in_proj_weight.copy_(torch.from_numpy(w.astype(np.float64)))
        mha.out_proj.weight.copy_(torch.from_numpy(layer.w_o.T.astype(np.float64)))
        if layer.bias:
            b = np.concatenate([layer.b_q, layer.b_k, layer.b_v])
            mha.in_proj_bias.copy_(torch.from_numpy(b.astype(np.float64)))
            mha.out_proj.bias.copy_(torch.from_numpy(layer.b_o.astype(np.float64)))
    return mha


def _randomize_biases(layer, rng):
    for name in ("b_q", "b_k", "b_v", "b_o"):
        b = getattr(layer, name)
        if b is not None:
            setattr(layer, name, rng.standard_normal(b.shape).astype(np.float32) * 0.1)


@pytest.mark.parametrize("case", range(40))
def test_forward_matches_torch_multihead_attention(case):
    rng = rng_for(4000 + case)
    H = int(rng.choice([1, 2, 3, 4]))
    E = H * int(rng.choice([1, 3, 16, 20]))
    B, N = int(rng.integers(1, 4)), int(rng.choice([1, 3, 17, 33]))
    cross = bool(rng.random() < 0.3)
    M = int(rng.choice([1, 5, 17])) if cross else N
    bias = bool(rng.random() < 0.5)
    causal = bool(rng.random() < 0.4) and not cross
    padded = bool(rng.random() < 0.3)
    layer = qkv.MultiHeadAttention(E, H, bias=bias, seed=int(rng.integers(0, 2**31)))
    _randomize_biases(layer, rng)
    x = rng.standard_normal((B, N, E)).astype(np.float32)
    kv = rng.standard_normal((B, M, E)).astype(np.float32) if cross else None
    lengths = [int(v) for v in rng.integers(1, M + 1, B)] if padded else None
    kwargs = {}
    torch_kwargs = {}
    if causal:
        kwargs["causal"] = True
        torch_kwargs["attn_mask"] = torch.triu(torch.ones(N, M, dtype=torch.bool), diagonal=1)
    if lengths:
        kwargs["key_lengths"] = lengths
        torch_kwargs["key_padding_mask"] = torch.arange(M)[None, :] >= torch.tensor(lengths)[:, None]
    out = layer.forward(x, kv, **kwargs)
    tx = torch.from_numpy(x).double()
    tkv = torch.from_numpy(kv).double() if cross else tx
    want, _ = _torch_mha(layer)(tx, tkv, tkv, need_weights=False, **torch_kwargs)
    note = f"{seed_note(4000 + case)} E={E} H={H} B={B} N={N} M={M} bias={bias} causal={causal} lengths={lengths}"
    assert out.shape == (B, N, E), note
    assert_close(out, want.detach().numpy(), TOL, note)


def _manual_layer(layer, x, kv=None, **mask):
    """The layer's definition in numpy/torch float64: projections, per-head attention, concat, W_o."""
    kv = x if kv is None else kv
    x64, kv64 = x.astype(np.float64), kv.astype(np.float64)

    def proj(inp, w, b):
        y = inp @ w.astype(np.float64)
        return y + b.astype(np.float64) if b is not None else y

    H, Hkv, D, Dv = layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.value_dim
    q = proj(x64, layer.w_q, layer.b_q).reshape(x.shape[0], -1, H, D).transpose(0, 2, 1, 3)
    k = proj(kv64, layer.w_k, layer.b_k).reshape(kv.shape[0], -1, Hkv, D).transpose(0, 2, 1, 3)
    v = proj(kv64, layer.w_v, layer.b_v).reshape(kv.shape[0], -1, Hkv, Dv).transpose(0, 2, 1, 3)
    ctx, _ = torch_attention(q, k, v, **mask)
    ctx = ctx.numpy().transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], H * Dv)
    return proj(ctx, layer.w_o, layer.b_o) if layer.output_projection else ctx


@pytest.mark.parametrize("config", [
    dict(embed_dim=12, num_heads=4, num_kv_heads=2),
    dict(embed_dim=12, num_heads=6, num_kv_heads=1, head_dim=5, value_dim=3, bias=True),
    dict(embed_dim=10, num_heads=2, head_dim=7, output_projection=False),
])
def test_gqa_and_odd_head_dims_match_the_definition(config):
    case = 4100 + len(str(config))
    rng = rng_for(case)
    layer = qkv.MultiHeadAttention(**config, seed=7)
    _randomize_biases(layer, rng)
    x = rng.standard_normal((2, 9, config["embed_dim"])).astype(np.float32)
    window = (2, 0)
    out = layer.forward(x, causal=True, window=window)
    want = _manual_layer(layer, x, causal=True, window=window)
    assert out.shape == want.shape, seed_note(case)
    assert_close(out, want, TOL, f"{seed_note(case)} {config}")


def test_rank2_input_and_parameter_free():
    rng = rng_for(4200)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    layer = qkv.MultiHeadAttention(6, parameter_free=True)
    assert layer.w_q is None and layer.parameters() == {}
    out = layer.forward(x)
    want, _ = torch_attention(x, x, x)
    assert_close(out, want.numpy()[0, 0], TOL, seed_note(4200))
    with pytest.raises(ValueError, match="this layer has no w_q"):
        layer.w_q = np.zeros((6, 6), np.float32)


def test_weights_are_views_and_setters_copy(tmp_path):
    rng = rng_for(4300)
    layer = qkv.MultiHeadAttention(8, 2, bias=True, seed=3)
    view = layer.w_q
    view[1, 2] = 4.5
    assert layer.w_q[1, 2] == 4.5
    new = rng.standard_normal((8, 8))  # float64 is rounded to float32
    layer.w_q = new
    assert np.array_equal(view, new.astype(np.float32)), "earlier views see the assignment"
    assert list(layer.parameters()) == ["w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"]
    with pytest.raises(ValueError, match=r"w_k: shape \[8, 7\] must be \[8, 8\]"):
        layer.w_k = np.zeros((8, 7), np.float32)
    with pytest.raises(ValueError, match=r"b_o contains NaN at index \(3,\)"):
        layer.b_o = np.array([0, 0, 0, np.nan, 0, 0, 0, 0], np.float32)
    with pytest.raises(TypeError, match="w_v: dtype int64 is not supported"):
        layer.w_v = np.zeros((8, 8), np.int64)
    del layer
    assert view.shape == (8, 8) and np.isfinite(view).all()  # the view keeps the layer alive


def test_save_and_load_round_trip(tmp_path):
    rng = rng_for(4400)
    layer = qkv.MultiHeadAttention(12, 4, num_kv_heads=2, bias=True, seed=11)
    _randomize_biases(layer, rng)
    path = str(tmp_path / "layer.safetensors")
    layer.save(path)
    loaded = qkv.MultiHeadAttention.load(path)
    assert repr(loaded) == repr(layer)
    layer.save(tmp_path / "as_path.safetensors")  # os.PathLike too
    assert repr(qkv.MultiHeadAttention.load(tmp_path / "as_path.safetensors")) == repr(layer)
    for name, w in layer.parameters().items():
        assert np.array_equal(getattr(loaded, name), w), name
    x = rng.standard_normal((3, 12)).astype(np.float32)
    assert np.array_equal(loaded.forward(x), layer.forward(x)), seed_note(4400)
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        qkv.MultiHeadAttention.load(str(tmp_path / "missing.safetensors"))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 20)
    with pytest.raises(ValueError, match="bad.safetensors"):
        qkv.MultiHeadAttention.load(str(bad))


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="embed_dim = 10 is not divisible by num_heads = 3"):
        qkv.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="num_heads, num_kv_heads: H = 4 query heads is not a positive multiple of Hkv = 3"):
        qkv.MultiHeadAttention(12, 4, num_kv_heads=3)
    with pytest.raises(TypeError):
        qkv.MultiHeadAttention("12")
    # Checked, never coerced: bias=1.5 was True and embed_dim=True was 1 (pybind11's conversion).
    for kwargs, exc, message in [
            (dict(embed_dim=16.0), TypeError, "embed_dim must be an integer, got 16.0"),
            (dict(embed_dim=True), TypeError, "embed_dim must be an integer, got True"),
            (dict(embed_dim=1 << 63), ValueError, "embed_dim = 9223372036854775808 is out of range"),
            (dict(embed_dim=16, bias=1.5), TypeError, "bias must be True or False, got 1.5"),
            (dict(embed_dim=16, output_projection=None), TypeError, "output_projection must be True or False"),
            (dict(embed_dim=16, seed=-1), ValueError, r"seed must be in \[0, 2\*\*64\), got -1"),
            (dict(embed_dim=16, seed=1 << 64), ValueError, r"seed must be in \[0, 2\*\*64\)"),
            # 4 · 2^62 wrapped to a width of 0: empty weights, then SIGFPE in forward.
            (dict(embed_dim=4, num_heads=4, head_dim=1 << 62), ValueError,
             "num_heads · head_dim = 4 · 4611686018427387904 is too large")]:
        with pytest.raises(exc, match=message):
            qkv.MultiHeadAttention(**kwargs)
    assert "num_heads=2" in repr(qkv.MultiHeadAttention(16, np.int64(2), bias=np.bool_(True), seed=np.uint8(3)))
    # Every seed a layer file or the CLI takes (it refused those past 2**63 as out of range).
    assert qkv.MultiHeadAttention(16, 2, seed=(1 << 64) - 1).seed == (1 << 64) - 1
    layer = qkv.MultiHeadAttention(4, 2)
    with pytest.raises(TypeError, match="training must be True or False, got 'no'"):
        layer.training = "no"
    with pytest.raises(TypeError, match=r"path must be a path \(str, bytes or os.PathLike\), got None"):
        layer.save(None)
    x = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError, match="forward\\(\\) got an unexpected keyword argument 'casual'"):
        layer.forward(x, casual=True)
    with pytest.raises(ValueError, match=r"x: expected \[N, E\] or \[B, N, E\], got shape \[4\]"):
        layer.forward(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="4|width|E"):
        layer.forward(np.ones((3, 5), np.float32))
    with pytest.raises(ValueError, match="x contains NaN at index \\(1, 2\\)"):
        bad = x.copy()
        bad[1, 2] = np.nan
        layer.forward(bad, check_finite=True)
    with pytest.raises(ValueError, match=r"alibi_slopes: expected 2 entries"):
        layer.forward(x, alibi_slopes=[0.5])


@pytest.mark.parametrize("case", range(12))
def test_backward_matches_torch_autograd(case):
    rng = rng_for(4500 + case)
    H = int(rng.choice([1, 2, 4]))
    E = H * int(rng.choice([2, 5, 8]))
    B, N = int(rng.integers(1, 3)), int(rng.choice([1, 3, 17]))
    cross = case % 3 == 2
    M = int(rng.choice([2, 9])) if cross else N
    bias, causal = case % 2 == 1, case % 4 == 0 and not cross
    layer = qkv.MultiHeadAttention(E, H, bias=bias, seed=case)
    _randomize_biases(layer, rng)
    x = rng.standard_normal((B, N, E)).astype(np.float32)
    kv = rng.standard_normal((B, M, E)).astype(np.float32) if cross else None
    dy = rng.standard_normal((B, N, E)).astype(np.float32)
    y = layer.forward(x, kv, causal=causal)
    grads_in = layer.backward(dy)
    dx, dkv = grads_in if cross else (grads_in, None)

    mha = _torch_mha(layer)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tkv = torch.tensor(kv, dtype=torch.float64, requires_grad=True) if cross else tx
    mask = torch.triu(torch.ones(N, M, dtype=torch.bool), diagonal=1) if causal else None
    ty, _ = mha(tx, tkv, tkv, need_weights=False, attn_mask=mask)
    (ty * torch.from_numpy(dy).double()).sum().backward()
    note = f"{seed_note(4500 + case)} E={E} H={H} B={B} N={N} M={M} bias={bias} causal={causal} cross={cross}"
    assert_close(y, ty.detach().numpy(), TOL, note)
    assert_close(dx, tx.grad.numpy(), TOL, f"dx {note}")
    if cross:
        assert_close(dkv, tkv.grad.numpy(), TOL, f"dkv {note}")
    g = mha.in_proj_weight.grad.numpy()
    want = {"w_q": g[:E].T, "w_k": g[E:2 * E].T, "w_v": g[2 * E:].T, "w_o": mha.out_proj.weight.grad.numpy().T}
    if bias:
        gb = mha.in_proj_bias.grad.numpy()
        want.update(b_q=gb[:E], b_k=gb[E:2 * E], b_v=gb[2 * E:], b_o=mha.out_proj.bias.grad.numpy())
    assert sorted(layer.grads) == sorted(want), note
    for name, w in want.items():
        assert_close(layer.grads[name], w, TOL, f"d{name} {note}")


def test_backward_needs_a_training_forward():
    layer = qkv.MultiHeadAttention(4, 2)
    with pytest.raises(ValueError, match="backward: no forward to go back through"):
        layer.backward(np.ones((3, 4), np.float32))
    x = np.ones((3, 4), np.float32)
    layer.forward(x)
    with pytest.raises(ValueError, match=r"dy has shape \[3, 5\]"):
        layer.backward(np.ones((3, 5), np.float32))
    layer.training = False
    layer.forward(x)
    with pytest.raises(ValueError, match="backward: no forward to go back through"):
        layer.backward(np.ones((3, 4), np.float32))


_LAYER_BITS = """
import ctypes, hashlib, sys
import numpy as np
import qkv
seed, num_threads = int(sys.argv[1]), int(sys.argv[2])
blas = ctypes.CDLL("libopenblas.so.0")  # numpy's OpenBLAS, which qkv shares in Python
before = blas.openblas_get_num_threads()
layer = qkv.MultiHeadAttention(100, num_heads=4, seed=seed, bias=True)
x = np.random.default_rng(seed).standard_normal((8, 96, 100)).astype(np.float32)
y = layer.forward(x, num_threads=num_threads)
layer.backward(np.cos(y))
h = hashlib.sha256(y.tobytes())
for name in sorted(layer.grads):
    h.update(np.ascontiguousarray(layer.grads[name]).tobytes())
print(h.hexdigest(), before, blas.openblas_get_num_threads())
"""


def test_layer_bits_are_the_same_for_any_thread_count_and_blas_setting(seed):
    """The projections' products (768 rows here, six blocks of qkv's grid) once ran on OpenBLAS's
    own threads, and their bits changed with OPENBLAS_NUM_THREADS and OMP_NUM_THREADS. numpy's
    OpenBLAS, which qkv shares in Python, keeps the thread count it had."""
    hashes = set()
    for env_threads, num_threads in (({}, 1), ({"OPENBLAS_NUM_THREADS": "2"}, 1), ({"OPENBLAS_NUM_THREADS": "1"}, 2),
                                     ({"OMP_NUM_THREADS": "3"}, 3), ({"OMP_NUM_THREADS": "1"}, 0)):
        env = {**os.environ, **env_threads}
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
            if name not in env_threads:
                env.pop(name, None)
        p = subprocess.run([sys.executable, "-c", _LAYER_BITS, str(seed), str(num_threads)], capture_output=True,
                           text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        digest, before, after = p.stdout.split()
        assert before == after, f"numpy's OpenBLAS threads {before} became {after} ({env_threads})"
        hashes.add(digest)
    assert len(hashes) == 1, f"QKV_TEST_SEED={seed}"
