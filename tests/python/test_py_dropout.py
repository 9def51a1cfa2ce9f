"""Attention dropout from numpy and qkv.torch: against the float64 composite with the same mask
(qkv.dropout_mask), gradients by FlashAttention's rule against PyTorch's fp32 composite with that
mask, the same bits for 1, 2 and 3 threads, replay from torch.manual_seed, and bad arguments."""
import numpy as np
import pytest

import qkv
from qkv_testlib import allowed_pairs

torch = pytest.importorskip("torch")
import qkv.torch as qt  # noqa: E402

CASES = [  # B, H, Hkv, N, M, D, causal, window
    (1, 1, 1, 1, 1, 40, False, None),
    (2, 2, 1, 3, 5, 59, True, None),
    (1, 4, 2, 37, 29, 111, False, (4, 2)),
    (2, 3, 3, 70, 70, 64, True, None),
]


def composite(q, k, v, keep, p, causal, window, dtype):
    """softmax(q·kᵀ/√D + mask) ∘ keep / (1 − p) · v in torch, in `dtype`, with autograd."""
    q, k, v = (torch.tensor(t, dtype=dtype, requires_grad=True) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ kk.transpose(-1, -2) / np.sqrt(q.shape[-1])
    allowed = allowed_pairs(*s.shape[-2:], causal, window)
    s = s.masked_fill(torch.from_numpy(~allowed), float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    out = (w * torch.from_numpy(keep).to(dtype) / (1 - p)) @ vv
    return out, (q, k, v)


@pytest.mark.parametrize("case", CASES)
def test_numpy_matches_the_composite_with_the_same_mask(case, seed):
    B, H, Hkv, N, M, D, causal, window = case
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, N, D), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, M, D), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, M, D), dtype=np.float32)
    dout = rng.standard_normal((B, H, N, D), dtype=np.float32)
    p, dseed = float(rng.uniform(0.05, 0.7)), int(rng.integers(0, 2**63))
    kw = dict(causal=causal, window=window, dropout_p=p, seed=dseed, dropout_offset=3)
    keep = qkv.dropout_mask((B, H, N, M), p, dseed, dropout_offset=3)
    ref, ins64 = composite(q, k, v, keep, p, causal, window, torch.float64)
    ref.backward(torch.from_numpy(dout).double())
    pt, ins32 = composite(q, k, v, keep, p, causal, window, torch.float32)
    pt.backward(torch.from_numpy(dout))
    runs = []
    for threads in (1, 2, 3):
        out, lse = qkv.scaled_dot_product_attention(q, k, v, return_lse="float64", num_threads=threads, **kw)
        grads = qkv.attention_backward(q, k, v, dout, out=out, lse=lse, num_threads=threads, **kw)
        runs.append((out, *grads))
    for a, b in zip(runs[0], runs[1]):
        assert np.array_equal(a, b), f"seed {seed}: 1 vs 2 threads"
    for a, b in zip(runs[0], runs[2]):
        assert np.array_equal(a, b), f"seed {seed}: 1 vs 3 threads"
    out, dq, dk, dv = runs[0]
    r = ref.detach().numpy()
    assert np.abs(out - r).max() <= 2e-5 * (1 + np.abs(r).max()), f"seed {seed} p {p}"
    for name, got, x64, x32 in zip(("dq", "dk", "dv"), (dq, dk, dv), ins64, ins32):
        want = x64.grad.numpy()
        bound = 2 * np.abs(x32.grad.double().numpy() - want).max() + 1e-5
        assert np.abs(got - want).max() <= bound, f"{name} seed {seed} p {p}"


def test_the_mask_keeps_one_minus_p_and_depends_on_every_key(seed):
    m = qkv.dropout_mask((2, 4, 300, 300), 0.25, seed)
    n = m.size
    assert abs(m.sum() - 0.75 * n) <= 5 * np.sqrt(n * 0.25 * 0.75), f"seed {seed}"
    for other in (qkv.dropout_mask((2, 4, 300, 300), 0.25, seed ^ 1),
                  qkv.dropout_mask((2, 4, 300, 300), 0.25, seed, dropout_offset=1)):
        agree = (other == m).mean()
        assert abs(agree - (0.25**2 + 0.75**2)) < 0.01, f"seed {seed}"
    assert np.array_equal(m[1, 2], qkv.dropout_mask((2, 4, 300, 300), 0.25, seed)[1, 2])
    assert qkv.dropout_mask((3, 5), 0.0, None).all()


@pytest.mark.parametrize("shape, exc, message", [
    # numpy's "array is too big" named no argument
    ((2 ** 40, 2 ** 40, 1, 1), ValueError, r"dropout_mask: shape \[1099511627776, 1099511627776, 1, 1\] is too large"),
    ((2 ** 70, 1), ValueError, r"shape\[0\] = 1180591620717411303424 is out of range"),
    ((3.5, 2), TypeError, r"shape\[0\] must be an integer, got 3.5"),
    (5, TypeError, "shape must be a sequence of integers, got 5"),
    ((np.array([2]), 2), TypeError, r"shape\[0\] must be an integer, got array\(\[2\]\)"),
    ((2, -1), ValueError, "shape must not have negative dims, got -1"),
])
def test_bad_shapes_are_refused_by_name(shape, exc, message):
    with pytest.raises(exc, match=message):
        qkv.dropout_mask(shape, 0.5, 1)


def test_a_shape_beyond_memory_is_a_memory_error():
    with pytest.raises(MemoryError, match=r"results of shape \[1048576, 1048576, 1024, 1\]: cannot allocate"):
        qkv.dropout_mask((2 ** 20, 2 ** 20, 2 ** 10, 1), 0.5, 1)


def test_torch_replays_from_manual_seed_and_matches_the_same_mask(seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 9, 16, generator=g, requires_grad=True) for _ in range(3))
    torch.manual_seed(seed)
    a = qt.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    a.sum().backward()
    ga = q.grad.clone()
    q.grad = None
    torch.manual_seed(seed)
    b = qt.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    b.sum().backward()
    assert torch.equal(a, b) and torch.equal(ga, q.grad), f"seed {seed}"
    c = qt.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    assert not torch.equal(a, c), "a second call must draw another mask"
    torch.manual_seed(seed)
    drawn = int(torch.empty((), dtype=torch.int64).random_())
    keep = qkv.dropout_mask((2, 3, 9, 9), 0.3, drawn)
    want, _ = composite(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), keep, 0.3, True, None,
                        torch.float64)
    assert (a.double() - want).abs().max() < 2e-5 * (1 + want.abs().max()), f"seed {seed}"


def test_torch_gradcheck_in_float64(seed):
    g = torch.Generator().manual_seed(seed)
    ins = [torch.randn(1, 2, 5, 6, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3)]

    def f(q, k, v):
        torch.manual_seed(seed)  # every evaluation draws the same mask
        return qt.scaled_dot_product_attention(q, k, v, dropout_p=0.4, window=(2, 1))

    assert torch.autograd.gradcheck(f, ins)


def test_multihead_attention_drops_in_training_only(seed):
    torch.manual_seed(seed)
    mha = qt.MultiheadAttention(16, 4, dropout=0.25, batch_first=True)
    ref = torch.nn.MultiheadAttention(16, 4, dropout=0.25, batch_first=True)
    ref.load_state_dict(mha.state_dict())
    x = torch.randn(2, 6, 16)
    mha.eval(), ref.eval()
    out, w = mha(x, x, x)
    want, want_w = ref(x, x, x)
    assert torch.allclose(out, want, atol=1e-5) and torch.allclose(w, want_w, atol=1e-6)
    mha.train()
    torch.manual_seed(seed)
    out, w = mha(x, x, x, average_attn_weights=False)
    out.sum().backward()
    assert mha.in_proj_weight.grad is not None
    # The returned weights are the dropped ones; each row's kept weights still sum to 1 / (1 - p)
    # times their softmax share, so the zeros are exactly the mask's.
    zeros = (w == 0).float().mean().item()
    assert 0.1 < zeros < 0.4, f"seed {seed}: {zeros} of the weights are zero"


def test_traced_calls_draw_their_mask_at_run_time(seed):
    def f(q, k, v):
        return qt.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    q = torch.randn(1, 2, 4, 8)
    traced = torch.jit.trace(f, (q, q, q), check_trace=False)
    assert "qkv::scaled_dot_product_attention" in str(traced.graph)
    torch.manual_seed(seed)
    a = traced(q, q, q)
    torch.manual_seed(seed)
    assert torch.equal(a, f(q, q, q))


@pytest.mark.parametrize("kw, error, message", [
    (dict(dropout_p=1.0, seed=1), ValueError, r"dropout_p must be in \[0, 1\), got 1"),
    (dict(dropout_p=-0.1, seed=1), ValueError, r"dropout_p must be in \[0, 1\)"),
    (dict(dropout_p=float("nan"), seed=1), ValueError, r"dropout_p must be in \[0, 1\)"),
    (dict(dropout_p=0.1), ValueError, r"dropout_p > 0 needs seed="),
    (dict(dropout_p=0.1, seed=-1), ValueError, r"seed must be in \[0, 2\*\*64\), got -1"),
    (dict(dropout_p=0.1, seed=2**64), ValueError, r"seed must be in \[0, 2\*\*64\)"),
    (dict(dropout_p=0.1, seed=1.5), TypeError, r"seed must be an integer, got 1.5"),
    (dict(dropout_p=0.1, seed=True), TypeError, r"seed must be an integer, got True"),
    (dict(dropout_p=0.1, seed=np.True_), TypeError, r"seed must be an integer, got True"),
    (dict(dropout_p=0.1, seed=1, dropout_offset=np.True_), TypeError, r"dropout_offset must be an integer"),
    (dict(dropout_p="x", seed=1), TypeError, r"dropout_p"),
])
def test_bad_dropout_arguments(kw, error, message):
    x = np.ones((1, 2, 3, 4), np.float32)
    with pytest.raises(error, match=message):
        qkv.scaled_dot_product_attention(x, x, x, **kw)
    with pytest.raises(error, match=message):
        qkv.attention_backward(x, x, x, x, **kw)


@pytest.mark.parametrize("p", [1.0, -0.5, 2.0])
def test_torch_refuses_a_probability_outside_zero_to_one(p):
    x = torch.ones(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        qt.scaled_dot_product_attention(x, x, x, dropout_p=p)
