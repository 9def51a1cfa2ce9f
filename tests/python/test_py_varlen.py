"""Packed variable-length attention from numpy (qkv.varlen_attention) and qkv.torch
(varlen_attention, FlashAttention's argument names): each sequence against torch's float64
composite (dropout with qkv.dropout_mask's mask for that sequence), gradients by FlashAttention's
rule against the fp32 composite, bitwise for 1/2/3 threads, and bad offsets."""
import numpy as np
import pytest

import qkv
from qkv_testlib import allowed_pairs

torch = pytest.importorskip("torch")
import qkv.torch as qt  # noqa: E402


def composite(q, k, v, keep, p, causal, window, dtype):
    """One sequence, [n, H, D] inputs, bottom-right causal, in torch with autograd."""
    q, k, v = (torch.tensor(t, dtype=dtype, requires_grad=True) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("nhd,mhd->hnm", q, kk) / np.sqrt(q.shape[-1])
    allowed = allowed_pairs(q.shape[0], k.shape[0], causal, window, bottom_right=True)
    s = s.masked_fill(torch.from_numpy(~allowed), float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    if keep is not None:
        w = w * torch.from_numpy(keep).to(dtype) / (1 - p)
    return torch.einsum("hnm,mhd->nhd", w, vv), (q, k, v)


@pytest.mark.parametrize("causal, window, p", [(False, None, 0.0), (True, None, 0.0), (True, (5, 0), 0.3),
                                               (False, (3, 2), 0.5)])
def test_each_sequence_matches_the_composite(seed, causal, window, p):
    rng = np.random.default_rng(seed)
    lens_q = [int(x) for x in rng.choice([1, 3, 17, 40, 65], 5)]
    lens_k = [n + int(rng.integers(0, 4)) for n in lens_q]
    cu_q, cu_k = np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0], np.cumsum(lens_k)])
    H, Hkv, D = 4, 2, 59
    q = rng.standard_normal((cu_q[-1], H, D), dtype=np.float32)
    k = rng.standard_normal((cu_k[-1], Hkv, D), dtype=np.float32)
    v = rng.standard_normal((cu_k[-1], Hkv, D), dtype=np.float32)
    dout = rng.standard_normal((cu_q[-1], H, D), dtype=np.float32)
    dseed = int(rng.integers(0, 2**63))
    kw = dict(causal=causal, causal_align="bottom_right", window=window, dropout_p=p, seed=dseed if p else None)
    runs = []
    for threads in (1, 2, 3):
        out, lse = qkv.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, num_threads=threads, **kw)
        runs.append((out, *qkv.varlen_attention_backward(q, k, v, dout, out, lse, cu_q, cu_k, num_threads=threads,
                                                          **kw)))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert np.array_equal(a, b), f"seed {seed}"
    out, dq, dk, dv = runs[0]
    for s in range(len(lens_q)):
        a, b, c, d = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        keep = qkv.dropout_mask((s + 1, H, b - a, d - c), p, dseed)[s].transpose(0, 1, 2) if p else None
        ref, ins64 = composite(q[a:b], k[c:d], v[c:d], keep, p, causal, window, torch.float64)
        ref.backward(torch.from_numpy(dout[a:b]).double())
        pt, ins32 = composite(q[a:b], k[c:d], v[c:d], keep, p, causal, window, torch.float32)
        pt.backward(torch.from_numpy(dout[a:b]))
        r = ref.detach().numpy()
        assert np.abs(out[a:b] - r).max() <= 2e-5 * (1 + np.abs(r).max()), f"seed {seed} sequence {s}"
        for name, got, x64, x32 in zip(("dq", "dk", "dv"), (dq[a:b], dk[c:d], dv[c:d]), ins64, ins32):
            want = x64.grad.numpy()
            assert np.abs(got - want).max() <= 2 * np.abs(x32.grad.double().numpy() - want).max() + 1e-5, \
                f"{name} seed {seed} sequence {s}"


def test_torch_takes_flash_attention_arguments(seed):
    torch.manual_seed(seed)
    lens = [7, 1, 30, 12]
    cu = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)
    q, k, v = (torch.randn(int(cu[-1]), 4, 32, requires_grad=True) for _ in range(3))
    out = qt.varlen_attention(q, k, v, cu, cu, max(lens), max(lens), causal=True, window_size=(8, 0))
    want = qkv.varlen_attention(*(t.detach().numpy() for t in (q, k, v)), cu.numpy(), cu.numpy(), causal=True,
                                causal_align="bottom_right", window=(8, 0))
    assert np.array_equal(out.detach().numpy(), want)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    torch.manual_seed(seed)
    a = qt.varlen_attention(q, k, v, cu, cu, dropout_p=0.2)
    torch.manual_seed(seed)
    assert torch.equal(a, qt.varlen_attention(q, k, v, cu, cu, dropout_p=0.2))
    bf = qt.varlen_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu, cu)
    assert bf.dtype == torch.bfloat16


def test_offsets_of_rank_2_are_refused_by_name():
    x = np.ones((3, 2, 4), np.float32)
    with pytest.raises(TypeError, match=r"cu_seqlens_q\[0\] must be an integer, got array\(\[0, 3\]\)"):
        qkv.varlen_attention(x, x, x, np.array([[0, 3]]), np.array([0, 3]))
    with pytest.raises(TypeError, match=r"cu_seqlens_k\[0\] must be an integer, got array\(\[0, 3\]\)"):
        qkv.varlen_attention(x, x, x, np.array([0, 3]), np.array([[0, 3]]))


def test_backward_takes_float64_or_float32_lse_only(seed):
    """lse was force-cast to float64: strings, complex (its imaginary part dropped), ints and lists
    were taken."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((7, 2, 4)).astype(np.float32) for _ in range(3))
    cu = [0, 3, 7]
    out, lse = qkv.varlen_attention(q, k, v, cu, cu, causal=True, return_lse=True)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    want = qkv.varlen_attention_backward(q, k, v, dout, out, lse, cu, cu, causal=True)
    got = qkv.varlen_attention_backward(q, k, v, dout, out, lse.astype(np.float32), cu, cu, causal=True)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4 * (1 + np.abs(a).max()), err_msg=f"seed {seed}")
    for bad, message in [(lse.astype(str), r"lse: dtype <U\d+ is not supported"),
                         (lse.astype(np.complex128), "lse: dtype complex128 is not supported"),
                         (lse.astype(np.int64), "lse: dtype int64 is not supported"),
                         (lse.astype(np.uint16), r"lse must be float64 \(or float32\)"),
                         (lse.tolist(), "lse must be a numpy array, got list"),
                         (None, "lse must be a numpy array, got NoneType")]:
        with pytest.raises(TypeError, match=message):
            qkv.varlen_attention_backward(q, k, v, dout, out, bad, cu, cu, causal=True)


@pytest.mark.parametrize("cu_q, cu_k, message", [
    ([1, 5], [0, 5], r"cu_seqlens_q\[0\] must be 0, got 1"),
    ([0, 3, 2, 5], [0, 1, 2, 5], r"cu_seqlens_q must not decrease"),
    ([0, 4], [0, 5], r"cu_seqlens_q must end at the 5 packed rows, got 4"),
    ([0, 5], [0, 2, 5], r"cu_seqlens_q has 2 entries but cu_seqlens_k has 3"),
])
def test_bad_offsets(cu_q, cu_k, message):
    x = np.ones((5, 2, 4), np.float32)
    with pytest.raises(ValueError, match=message):
        qkv.varlen_attention(x, x, x, cu_q, cu_k)
    t = torch.ones(5, 2, 4)
    with pytest.raises(ValueError, match=message):
        qt.varlen_attention(t, t, t, torch.tensor(cu_q), torch.tensor(cu_k))


def test_torch_refuses_what_it_cannot_do():
    t = torch.ones(5, 2, 4)
    cu = torch.tensor([0, 5])
    with pytest.raises(ValueError, match="max_seqlen_q = 3, but a sequence has 5 rows"):
        qt.varlen_attention(t, t, t, cu, cu, 3, 5)
    with pytest.raises(ValueError, match="return_attn_probs is not supported"):
        qt.varlen_attention(t, t, t, cu, cu, return_attn_probs=True)
    with pytest.raises(TypeError, match="float64 is not supported"):
        qt.varlen_attention(t.double(), t.double(), t.double(), cu, cu)
    with pytest.raises(TypeError, match="cu_seqlens_q must be a 1-D int32 or int64 tensor"):
        qt.varlen_attention(t, t, t, cu.float(), cu)
