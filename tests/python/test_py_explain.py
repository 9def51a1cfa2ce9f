"""qkv.explain: the steps agree with each other, with numpy, and with the layer."""

import json

import numpy as np
import pytest

import qkv
from py_oracle import rng_for, seed_note



def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _check_steps(steps, x, w_q, w_k, w_v, heads=1, tol=1e-12):
    """Recomputes every step of every head in numpy float64 from x and the W's."""
    q_all, k_all, v_all = x @ w_q, x @ w_k, x @ w_v
    d = q_all.shape[1] // heads
    concat = []
    for h, step in enumerate(steps["heads"]):
        q = q_all[:, h * d:(h + 1) * d]
        k = k_all[:, h * d:(h + 1) * d]
        v = v_all[:, h * d:(h + 1) * d]
        scores = q @ k.T
        weights = _softmax(scores / np.sqrt(d))
        np.testing.assert_allclose(step["q"], q, atol=tol)
        np.testing.assert_allclose(step["scores"], scores, atol=tol)
        assert step["scale"] == pytest.approx(1 / np.sqrt(d), abs=1e-15)
        np.testing.assert_allclose(step["scaled_scores"], scores / np.sqrt(d), atol=tol)
        np.testing.assert_allclose(step["weights"], weights, atol=tol)
        np.testing.assert_allclose(step["weights"].sum(axis=1), 1.0, atol=1e-12)
        np.testing.assert_allclose(step["context"], weights @ v, atol=tol)
        concat.append(weights @ v)
    np.testing.assert_allclose(steps["concat"], np.concatenate(concat, axis=1), atol=tol)


def test_default_is_seed_003_worked_example():
    steps = qkv.explain()
    x = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]])  # from the seed's text
    w_q = np.array([[0.1, 0.2, 0.0, 0.0], [0.0, 0.1, 0.3, 0.0], [0.1, 0.0, 0.0, 0.2], [0.0, 0.0, 0.2, 0.3]])
    np.testing.assert_array_equal(steps["x"], x)
    np.testing.assert_array_equal(steps["w_q"], w_q)
    assert len(steps["tokens"]) == 3 and steps["num_heads"] == 1 and steps["d_k"] == 4
    _check_steps(steps, steps["x"], steps["w_q"], steps["w_k"], steps["w_v"])
    assert "playing-outside" in qkv.explain_examples()


def test_from_projections_with_two_heads():
    rng = rng_for(7000)
    x = rng.standard_normal((4, 6))
    w_q, w_k, w_v = (rng.standard_normal((6, 4)) for _ in range(3))
    steps = qkv.explain(x=x, w_q=w_q, w_k=w_k, w_v=w_v, num_heads=2, tokens=["a", "b", "c", "d"])
    assert steps["tokens"] == ["a", "b", "c", "d"] and len(steps["heads"]) == 2 and steps["w_o"] is None
    _check_steps(steps, x, w_q, w_k, w_v, heads=2)


def test_layer_explanation_matches_forward():
    rng = rng_for(7100)
    layer = qkv.MultiHeadAttention(8, 2, bias=True, seed=5)
    layer.b_q = rng.standard_normal(8).astype(np.float32)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    steps = qkv.explain(x=x, layer=layer)
    np.testing.assert_allclose(steps["output"], layer.forward(x), atol=1e-5, err_msg=seed_note(7100))


def test_layer_refuses_heads_and_weights_it_does_not_use():
    """With layer=, num_heads, num_kv_heads and the biases and w_o were ignored without a word
    (num_heads=7 explained the layer's 2 heads). A value equal to the layer's is no conflict."""
    layer = qkv.MultiHeadAttention(4, 2, seed=1)
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"^explain: num_heads=7 conflicts with layer, which has num_heads=2; leave "
                                         r"num_heads out \(the layer brings its own\)$"):
        qkv.explain(x=x, layer=layer, num_heads=7)
    with pytest.raises(ValueError, match=r"^explain: num_kv_heads=1 conflicts with layer, which has num_kv_heads=2; "
                                         r"leave num_kv_heads out \(the layer brings its own\)$"):
        qkv.explain(x=x, layer=layer, num_kv_heads=1)
    for name in ("b_q", "b_k", "b_v", "w_o", "b_o"):
        with pytest.raises(ValueError, match=rf"^explain: {name} is not used with layer \(the layer brings its own "
                                             r"weights\)$"):
            qkv.explain(x=x, layer=layer, **{name: np.zeros(4)})
    assert qkv.explain(x=x, layer=layer, num_heads=2, num_kv_heads=2)["num_heads"] == 2


def test_parameter_free_and_qkv_and_renderings():
    rng = rng_for(7200)
    x = rng.standard_normal((3, 4))
    steps = qkv.explain(x=x)
    assert steps["parameter_free"]
    np.testing.assert_allclose(steps["heads"][0]["context"], _softmax(x @ x.T / 2.0) @ x, atol=1e-12)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((3, 2)), rng.standard_normal((3, 5))
    steps = qkv.explain(q=q, k=k, v=v)
    np.testing.assert_allclose(steps["heads"][0]["context"], _softmax(q @ k.T / np.sqrt(2)) @ v, atol=1e-12)
    assert steps["tokens"] == ["t0", "t1", "t2"]
    assert "Tokens" in qkv.explain(format="text")
    assert json.loads(qkv.explain(format="json"))["d_k"] == 4


def test_explain_bad_arguments():
    with pytest.raises(ValueError, match="playing-outside"):
        qkv.explain("no-such-example")
    with pytest.raises(ValueError, match="q, k and v go together"):
        qkv.explain(q=np.ones((2, 2)))
    with pytest.raises(ValueError, match="w_q, w_k and w_v go together"):
        qkv.explain(x=np.ones((2, 2)), w_q=np.ones((2, 2)))
    with pytest.raises(ValueError, match="give one of"):
        qkv.explain("seed-003", q=np.ones((2, 2)), k=np.ones((2, 2)), v=np.ones((2, 2)))
    with pytest.raises(ValueError, match="format must be 'dict', 'text', 'json' or 'html', got 'xml'"):
        qkv.explain(format="xml")
    with pytest.raises(ValueError, match="2 rows but 3 tokens"):
        qkv.explain(x=np.ones((2, 2)), tokens=["a", "b", "c"])
    with pytest.raises(TypeError, match="tokens must be a list of strings, one per row"):
        qkv.explain(x=np.ones((2, 2)), tokens=5)
    with pytest.raises(TypeError, match="x: dtype int64 is not supported"):
        qkv.explain(x=np.ones((2, 2), np.int64))
    # Too many rows for the N x N tables: the count is q's (it once read x, absent here, as 0).
    big = np.ones((10**6, 2), np.float32)
    with pytest.raises(MemoryError, match="explain: the N x N steps of 1000000 tokens and 1 heads: cannot allocate "
                                          "24000000000000 bytes"):
        qkv.explain(q=big, k=big, v=big)
    # With a layer, its heads (the message said "1 heads" whatever the layer had).
    layer = qkv.MultiHeadAttention(4, 2, seed=1)
    big = np.ones((10**6, 4), np.float32)
    with pytest.raises(MemoryError, match="explain: the N x N steps of 1000000 tokens and 2 heads: cannot allocate "
                                          "48000000000000 bytes"):
        qkv.explain(x=big, layer=layer)
    # Refused by name (these leaked pybind11's "Unable to cast" or its signature of explain()).
    x = np.ones((2, 4), np.float32)
    for kwargs, exc, message in [
            (dict(example=1), TypeError, "example must be a string, got 1"),
            (dict(x=x, layer="x"), TypeError, "layer must be a qkv.MultiHeadAttention, got 'x'"),
            (dict(x=x, tokens=["a", "\udcff"]), ValueError, "tokens\\[1\\] = .* is not valid Unicode text"),
            (dict(format=None), TypeError, "format must be a string, got None"),
            (dict(format="text", precision=1.5), TypeError, "precision must be an integer, got 1.5"),
            (dict(format="text", precision=1 << 31), ValueError, r"precision must be in \[0, 17\], got 2147483648"),
            (dict(x=x, w_q=np.ones((4, 4)), w_k=np.ones((4, 4)), w_v=np.ones((4, 4)), num_heads="2"), TypeError,
             "num_heads must be an integer, got '2'")]:
        example = kwargs.pop("example", None)
        with pytest.raises(exc, match=message):
            qkv.explain(example, **kwargs)


def test_explain_refuses_a_step_past_float64_from_finite_input():
    """x = 1e300 gave NaN weights (scores of 1e600 are inf): refused, naming the step, by the
    attention kernels' overflow rule; NaN inputs still pass through as the caller's own."""
    for kwargs, inputs, step in [
            (dict(x=np.full((2, 2), 1e300)), "X", "the scores Q·Kᵀ of head 0"),
            (dict(q=np.full((2, 2), 1e200), k=np.full((2, 2), 1e200), v=np.ones((2, 2))), "q, k and v",
             "the scores Q·Kᵀ of head 0"),
            (dict(x=np.full((2, 2), 1e200), w_q=np.full((2, 2), 1e200), w_k=np.ones((2, 2)), w_v=np.ones((2, 2))),
             "X, the weights and the biases", "Q of head 0")]:
        for fmt in ("dict", "text"):
            with pytest.raises(ValueError) as err:
                qkv.explain(**kwargs, format=fmt)
            assert str(err.value) == (f"explain: the output overflowed float64 although {inputs} are finite ({step} "
                                      f"beyond 1.8e308); scale the inputs down"), err.value
    x = np.full((2, 2), 1e300)
    x[0, 0] = np.nan
    assert np.isnan(qkv.explain(x=x)["heads"][0]["weights"]).any()
