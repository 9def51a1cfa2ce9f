"""qkv.KVCache and qkv.decode_attention against a numpy float64 reference on the stored values."""

import numpy as np
import pytest

import qkv


def _reference(q, ks, vs, causal, window, sinks, sink_tokens):
    """q [B, H, N, D]; ks[b], vs[b] [Hkv, len, D] float64; the formulas of include/qkv/decode.h."""
    B, H, N, D = q.shape
    out = np.zeros((B, H, N, vs[0].shape[-1]))
    lse = np.full((B, H, N), -np.inf)
    for b in range(B):
        Hkv, L, _ = ks[b].shape
        for h in range(H):
            g = h // (H // Hkv)
            s = q[b, h].astype(np.float64) @ ks[b][g].T / np.sqrt(D)  # [N, L]
            j = np.arange(L)
            for i in range(N):
                diag = i + L - N if causal else i
                allowed = np.ones(L, bool)
                if causal:
                    allowed &= j <= diag
                if window is not None:
                    allowed &= j >= diag - window
                allowed |= (j < sink_tokens) & ((j <= diag) if causal else True)
                if not allowed.any():
                    continue
                row = np.where(allowed, s[i], -np.inf)
                m = row.max()
                sink = -np.inf if sinks is None else sinks[h]
                m = max(m, sink)
                p = np.exp(row - m)
                denom = p.sum() + np.exp(sink - m)
                out[b, h, i] = p @ vs[b][g] / denom
                lse[b, h, i] = m + np.log(denom)
    return out, lse


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "i8"])
@pytest.mark.parametrize("variant", ["plain", "causal", "window_sinks", "streaming"])
def test_decode_matches_float64_reference(dtype, variant, seed):
    rng = np.random.default_rng(seed)
    note = f"seed {seed} (QKV_TEST_SEED={seed}) dtype {dtype} {variant}"
    Hkv, G, N, D = 2, 4, 3, 40
    cache = qkv.KVCache(num_pages=64, page_tokens=16, kv_heads=Hkv, head_dim=D, dtype=dtype)
    lens = [int(x) for x in rng.integers(1, 300, size=3)]
    ids = []
    for L in lens:
        s = cache.create()
        done = 0
        while done < L:  # appended in pieces, interleaved page use across sequences
            T = min(L - done, int(rng.integers(1, 50)))
            cache.append(s, rng.standard_normal((T, Hkv, D), dtype=np.float32),
                         rng.standard_normal((T, Hkv, D), dtype=np.float32))
            done += T
        ids.append(s)
        assert cache.length(s) == L
    q = rng.standard_normal((3, Hkv * G, N, D), dtype=np.float32)
    kw = dict(causal=variant != "plain")
    window = 25 if variant in ("window_sinks", "streaming") else None
    if window is not None:
        kw["window"] = (window, None)
    sinks = rng.uniform(-1, 2, size=Hkv * G).astype(np.float32) if variant != "plain" else None
    if sinks is not None:
        kw["sinks"] = sinks
    sink_tokens = 4 if variant == "streaming" else 0
    out, lse = qkv.decode_attention(q, cache, ids, sink_tokens=sink_tokens, return_lse=True, **kw)
    ks = [cache.keys(s).astype(np.float64) for s in ids]
    vs = [cache.values(s).astype(np.float64) for s in ids]
    want, want_lse = _reference(q, ks, vs, kw["causal"], window, sinks, sink_tokens)
    tol = 2e-5 * (1 + np.abs(want).max())
    assert np.abs(out - want).max() <= tol, note
    finite = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(lse), finite), note
    assert np.abs(lse[finite] - want_lse[finite]).max() <= 2e-5 * (1 + np.abs(want_lse[finite]).max()), note


def test_cache_views_fork_free_and_errors(seed):
    rng = np.random.default_rng(seed)
    cache = qkv.KVCache(num_pages=4, page_tokens=8, kv_heads=1, head_dim=4, dtype="f16")
    s = cache.create()
    k = rng.standard_normal((10, 1, 4), dtype=np.float32)
    cache.append(s, k, k)
    pool = cache.k_pool
    assert pool.shape == (4, 1, 8, 4) and pool.dtype == np.uint16 and not pool.flags.writeable
    first = cache.pages(s)[0]
    np.testing.assert_array_equal(pool[first, 0, :8].view(np.float16).astype(np.float32), cache.keys(s)[0, :8])
    np.testing.assert_allclose(cache.keys(s)[0], k[:, 0], rtol=2 ** -11)
    child = cache.fork(s)
    assert cache.free_pages == 2
    cache.append(child, k[:1], k[:1])
    assert cache.free_pages == 1 and cache.length(child) == 11 and cache.length(s) == 10
    with pytest.raises(ValueError, match="unknown sequence id 99"):
        cache.append(99, k, k)
    with pytest.raises(ValueError, match="20 tokens need 2 free pages, the pool of 4 has 1 left"):
        cache.append(s, np.zeros((20, 1, 4), np.float32), np.zeros((20, 1, 4), np.float32))
    assert cache.length(s) == 10
    with pytest.raises(ValueError, match="mismatched head dims"):
        qkv.decode_attention(np.zeros((1, 1, 1, 5), np.float32), cache, [s])
    cache.free(s)
    cache.free(child)
    assert cache.free_pages == 4
    i8 = qkv.KVCache(num_pages=1, page_tokens=4, kv_heads=1, head_dim=4, dtype="i8")
    assert i8.k_scales.shape == (1, 1, 4)
    with pytest.raises(ValueError, match="dtype must be"):
        qkv.KVCache(num_pages=1, page_tokens=4, kv_heads=1, head_dim=4, dtype="int4")


def test_rotary_on_append_matches_formula(seed):
    rng = np.random.default_rng(seed)
    D = 8
    cache = qkv.KVCache(num_pages=2, page_tokens=8, kv_heads=1, head_dim=D)
    s = cache.create()
    k = rng.standard_normal((5, 1, D), dtype=np.float32)
    cache.append(s, k[:2], k[:2], rotary={"layout": "interleaved", "theta": 100.0})
    cache.append(s, k[2:], k[2:], rotary={"layout": "interleaved", "theta": 100.0})
    pos = np.arange(5)[:, None]
    angle = pos * 100.0 ** (-2 * np.arange(D // 2) / D)
    x0, x1 = k[:, 0, 0::2].astype(np.float64), k[:, 0, 1::2].astype(np.float64)
    want = np.empty((5, D))
    want[:, 0::2] = x0 * np.cos(angle) - x1 * np.sin(angle)
    want[:, 1::2] = x0 * np.sin(angle) + x1 * np.cos(angle)
    np.testing.assert_allclose(cache.keys(s)[0], want, atol=1e-5)
    np.testing.assert_array_equal(cache.values(s)[0], k[:, 0])


def test_decode_weights_and_top_k_match_the_reference(seed):
    """Per-key weights reproduce the float64 reference's softmax; top_k are their largest entries,
    largest first, -1 past the allowed keys; bad top_k is refused by name."""
    rng = np.random.default_rng(seed)
    note = f"seed {seed} (QKV_TEST_SEED={seed})"
    Hkv, G, N, D = 2, 2, 2, 24
    cache = qkv.KVCache(num_pages=32, page_tokens=8, kv_heads=Hkv, head_dim=D, dtype="f16")
    ids = []
    for L in (61, 3):
        s = cache.create()
        cache.append(s, rng.standard_normal((L, Hkv, D), dtype=np.float32),
                     rng.standard_normal((L, Hkv, D), dtype=np.float32))
        ids.append(s)
    q = rng.standard_normal((2, Hkv * G, N, D), dtype=np.float32)
    w = qkv.decode_attention_weights(q, cache, ids, window=(20, None))
    assert w.shape == (2, Hkv * G, N, 61) and w.dtype == np.float32, note
    for b, s in enumerate(ids):
        k = cache.keys(s).astype(np.float64)
        L = k.shape[1]
        for h in range(Hkv * G):
            scores = q[b, h].astype(np.float64) @ k[h // G].T / np.sqrt(D)
            for i in range(N):
                diag = i + L - N
                j = np.arange(L)
                allowed = (j <= diag) & (j >= diag - 20)
                p = np.where(allowed, np.exp(scores[i] - scores[i][allowed].max()), 0.0)
                want = np.zeros(61)
                want[:L] = p / p.sum()
                assert np.abs(w[b, h, i] - want).max() <= 1e-6, note
    values, indices = qkv.decode_attention_weights(q, cache, ids, window=(20, None), top_k=5)
    assert values.shape == indices.shape == (2, Hkv * G, N, 5) and indices.dtype == np.int64, note
    order = np.argsort(-w, axis=-1, kind="stable")[..., :5]
    taken = np.take_along_axis(w, order, axis=-1)
    assert np.array_equal(np.where(taken > 0, order, -1), indices), note
    assert np.array_equal(np.where(taken > 0, taken, 0), values), note
    assert np.all(indices[1, :, :, 3:] == -1), note  # the 3-token sequence
    for bad in (0, -1):  # -1 once failed in numpy's allocation instead, with numpy's message
        with pytest.raises(ValueError, match=f"top_k must be at least 1, got {bad}"):
            qkv.decode_attention_weights(q, cache, ids, top_k=bad)
    with pytest.raises(ValueError, match=r"sinks\[1\] = nan must be a finite logit or -inf"):
        qkv.decode_attention(q, cache, ids, sinks=[0.0, float("nan")] + [0.0] * (q.shape[1] - 2))
