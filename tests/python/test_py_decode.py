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


def test_decode_arguments_are_refused_by_name_not_coerced():
    """A float or string sequence id, a truthy string for a flag, an out-of-range int: each is a
    TypeError / ValueError naming the argument. Before, [s + 0.99] silently used sequence s,
    causal='no' meant True, and out-of-range ints dumped the binding's private signature."""
    cache = qkv.KVCache(num_pages=4, page_tokens=4, kv_heads=1, head_dim=4)
    s = cache.create()
    cache.append(s, np.ones((3, 1, 4), np.float32), np.ones((3, 1, 4), np.float32))
    q = np.ones((1, 2, 1, 4), np.float32)
    cases = [
        (dict(seq_ids=[s + 0.99]), TypeError, r"seq_ids\[0\] must be an integer, got 0.99"),
        (dict(seq_ids=["0"]), TypeError, r"seq_ids\[0\] must be an integer, got '0'"),
        (dict(seq_ids="0"), TypeError, "seq_ids must be a sequence of integers, got '0'"),
        (dict(seq_ids=[True]), TypeError, r"seq_ids\[0\] must be an integer, got True"),
        (dict(seq_ids=[1 << 63]), ValueError, r"seq_ids\[0\] = 9223372036854775808 is out of range"),
        (dict(causal="no"), TypeError, "causal must be True or False, got 'no'"),
        (dict(sink_tokens=1.5), TypeError, "sink_tokens must be an integer, got 1.5"),
        (dict(num_threads=-1), ValueError, r"num_threads must be >= 0 \(0 = default\), got -1"),
        (dict(num_threads=1 << 31), ValueError, "num_threads = 2147483648 is out of range"),
        (dict(return_lse="float64"), TypeError, "return_lse must be True or False, got 'float64'"),
        (dict(simd=None), TypeError, "simd must be a string, got None"),
        (dict(scale="x"), TypeError, "scale must be a number or None, got 'x'"),
        (dict(scale=1e300), ValueError, r"decode_attention: scale must be finite and at most FLT_MAX"),
        (dict(sinks=["1", 0]), TypeError, r"sinks\[0\] must be a number, got '1'"),
        (dict(q=None), TypeError, "q must be a numpy array"),
        # float16 was pointed at "uint16 holding bfloat16 bits", which decode then refused.
        (dict(q=q.astype(np.float16)), TypeError,
         r"q: dtype float16 is not supported; pass float32 \(or float64, rounded to float32\)"),
        (dict(cache=None), TypeError, "cache must be a qkv.KVCache, got None"),
    ]
    for change, exc, message in cases:
        kw = dict(q=q, cache=cache, seq_ids=[s])
        kw.update(change)
        args = (kw.pop("q"), kw.pop("cache"), kw.pop("seq_ids"))
        with pytest.raises(exc, match=message):
            qkv.decode_attention(*args, **kw)
    with pytest.raises(TypeError, match="scale must be a number or None, got 'x'"):
        qkv.decode_attention_weights(q, cache, [s], scale="x")
    # The cache's own sizes and sequence ids: pybind11 took True as 1.
    for call, message in [(lambda: qkv.KVCache(True, 4, 1, 2), "num_pages must be an integer, got True"),
                          (lambda: qkv.KVCache(4, 4, 1, 2, dtype=None), "dtype must be a string, got None"),
                          (lambda: cache.length(True), "seq must be an integer, got True"),
                          (lambda: cache.fork(0.5), "seq must be an integer, got 0.5"),
                          (lambda: cache.keys("0"), "seq must be an integer, got '0'")]:
        with pytest.raises(TypeError, match=message):
            call()
    assert cache.length(np.int64(s)) == cache.length(s)
    # numpy integers and booleans are integers and booleans.
    out = qkv.decode_attention(q, cache, np.array([s]), causal=np.bool_(True), num_threads=np.int64(1))
    assert out.shape == (1, 2, 1, 4)
    for rotary, message in [({"theta": "x"}, "rotary theta must be a number, got 'x'"),
                            ({"layout": None}, "rotary layout must be a string, got None"),
                            ({1: 2}, "a rotary key must be a string, got 1")]:
        with pytest.raises(TypeError, match=message):
            cache.append(s, np.ones((1, 1, 4), np.float32), np.ones((1, 1, 4), np.float32), rotary=rotary)
    assert cache.length(s) == 3


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


def _rotary_reference(x, pos, theta, rotary_dim, layout):
    """x [..., N, D] float64 rotated at positions pos [..., N] (the RoPE formula, in float64)."""
    x = x.astype(np.float64).copy()
    half = rotary_dim // 2
    angle = pos[..., None] * theta ** (-2 * np.arange(half) / rotary_dim)
    if layout == "interleaved":
        a, b = x[..., 0:rotary_dim:2].copy(), x[..., 1:rotary_dim:2].copy()
        x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2] = a * np.cos(angle) - b * np.sin(angle), \
            a * np.sin(angle) + b * np.cos(angle)
    else:
        a, b = x[..., :half].copy(), x[..., half:rotary_dim].copy()
        x[..., :half], x[..., half:rotary_dim] = a * np.cos(angle) - b * np.sin(angle), a * np.sin(angle) + b * np.cos(angle)
    return x


def test_apply_rotary_matches_the_formula_and_the_keys_rotated_on_append(seed):
    """qkv.apply_rotary (for q, and for prefill) is the rotation append gives the keys: a decode
    step with q rotated at the new tokens' positions equals attention over unrotated keys with the
    rotation applied to both by the formula."""
    rng = np.random.default_rng(seed)
    note = f"seed {seed} (QKV_TEST_SEED={seed})"
    for layout in ("half_split", "interleaved"):
        for rotary_dim in (0, 6):
            B, H, N, D = 2, 2, 3, 10
            x = rng.standard_normal((B, H, N, D), dtype=np.float32)
            got = qkv.apply_rotary(x, [5, 123456], layout=layout, theta=500000.0, rotary_dim=rotary_dim)
            pos = np.array([5, 123456])[:, None, None] + np.arange(N)
            want = _rotary_reference(x, pos, 500000.0, rotary_dim or D, layout)
            np.testing.assert_allclose(got, want, atol=2e-6, err_msg=note)
            assert got.dtype == np.float32 and got.shape == x.shape
            np.testing.assert_array_equal(qkv.apply_rotary(x[0, 0], 7, layout=layout, rotary_dim=rotary_dim),
                                          qkv.apply_rotary(x[:1, :1], [7], layout=layout, rotary_dim=rotary_dim)[0, 0])
    # Keys rotated on append and q rotated by apply_rotary at the same positions.
    rotary = {"layout": "half_split", "theta": 10000.0}
    cache = qkv.KVCache(num_pages=8, page_tokens=4, kv_heads=1, head_dim=8)
    s = cache.create()
    k = rng.standard_normal((9, 1, 8), dtype=np.float32)
    cache.append(s, k, k, rotary=rotary)
    q = rng.standard_normal((1, 2, 2, 8), dtype=np.float32)
    qr = qkv.apply_rotary(q, [cache.length(s) - 2])
    np.testing.assert_allclose(qr, _rotary_reference(q, np.array([7, 8]), 10000.0, 8, "half_split"), atol=2e-6)
    np.testing.assert_allclose(cache.keys(s)[0], _rotary_reference(k[:, 0], np.arange(9), 10000.0, 8, "half_split"),
                               atol=2e-6)
    for bad, exc, message in [(dict(positions=[1, 2, 3]), ValueError, r"positions: expected one per batch row \(B = 1\)"),
                              (dict(positions=-1), ValueError, "negative"),
                              (dict(positions=1.5), TypeError, "positions must be an integer"),
                              (dict(rotary_dim=3), ValueError, "rotary_dim"),
                              (dict(layout="x"), ValueError, "rotary layout must be")]:
        with pytest.raises(exc, match=message):
            qkv.apply_rotary(q, **bad)
    with pytest.raises(ValueError, match=r"x: expected \[N, D\], \[H, N, D\] or \[B, H, N, D\]"):
        qkv.apply_rotary(np.zeros(4, np.float32))


def test_apply_rotary_refuses_a_finite_element_turned_past_float32_and_passes_an_empty_head():
    """3e38 turned at position 1 gives 4.1e38: it came back as inf. The rule is the library's, so
    KVCache.append(rotary=) names the element the same way. A head of D = 0 is an empty array, which
    an elementwise op returns as it is (torch does), as an N = 0 input is."""
    x = np.full((2, 4), 3e38, np.float32)
    message = (r"apply_rotary: x at token 0, element 2 = 3e\+38 turns into inf at position 1 \(with element 0 = "
               r"3e\+38\), past float32's 3.4e38; scale x down \(it is unchanged\)")
    with pytest.raises(ValueError, match=message):
        qkv.apply_rotary(x, 1)
    with pytest.raises(ValueError, match=r"x at batch row 1, head 0, token 0, element 2 = 3e\+38 turns into inf"):
        qkv.apply_rotary(np.concatenate([np.ones((1, 2, 1, 4), np.float32), x.reshape(1, 2, 1, 4)]), [0, 1])
    cache = qkv.KVCache(2, 4, 1, 4)
    s = cache.create()
    with pytest.raises(ValueError, match="token 1, element 2 = 3e\\+38 turns into inf at position 1"):
        cache.append(s, x.reshape(2, 1, 4), np.ones((2, 1, 4), np.float32), rotary={})
    assert cache.length(s) == 0
    for shape in ((2, 0), (3, 2, 0), (2, 0, 4)):
        empty = np.ones(shape, np.float32)
        got = qkv.apply_rotary(empty, 5)
        assert got.shape == shape and got.dtype == np.float32
    with pytest.raises(ValueError, match=r"rotary_dim = 2 must be even and in \[2, D = 0\]"):
        qkv.apply_rotary(np.ones((2, 0), np.float32), rotary_dim=2)


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
    # A finite logit float32 cannot hold is named as given, not as the inf it would round to.
    with pytest.raises(ValueError, match=r"sinks\[1\] = 1e\+39 is beyond float32's range"):
        qkv.decode_attention(q, cache, ids, sinks=[0.0, 1e39] + [0.0] * (q.shape[1] - 2))
