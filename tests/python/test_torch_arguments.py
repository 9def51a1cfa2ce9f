"""Arguments in the forms FlashAttention and PyTorch code pass them, taken alike by every qkv.torch
front end (eager, traced, varlen, the ring), and refused by the same checks with the same classes
and messages naming the argument the caller passed (and, for a mask value, its index in the
caller's tensor).
"""

import math
import warnings

import pytest
import torch
import torch.distributed as dist

import qkv
import qkv.torch as qt
from py_oracle import rng_for, seed_note

SLOPES = [0.5, 0.25, 0.125, 0.0625]


GLOO = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                          reason="ring_attention needs torch.distributed with gloo")


def qkv4(seed, shape=(2, 4, 5, 16)):
    rng = rng_for(seed)
    return [torch.from_numpy(rng.standard_normal(shape)).float() for _ in range(3)]


def traced(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # tensor arguments become constants
        return torch.jit.trace(f, args, check_trace=True)


def test_slopes_and_lengths_as_tensors_equal_the_lists():
    """FlashAttention passes alibi_slopes as an fp32 tensor [H]. Before, the eager call refused it
    ("alibi_slopes must be a sequence of floats") while a traced one took it, so torch.jit.trace
    with check_trace=True failed."""
    q, k, v = qkv4(7000)
    want = qt.scaled_dot_product_attention(q, k, v, alibi_slopes=SLOPES, key_lengths=[3, 5], query_lengths=4)
    for slopes, lengths, rows in ((torch.tensor(SLOPES), torch.tensor([3, 5]), torch.tensor(4)),
                                  (torch.tensor(SLOPES, dtype=torch.float64), torch.tensor([3, 5], dtype=torch.int32),
                                   torch.tensor([4, 4], dtype=torch.int16)),
                                  (torch.tensor(SLOPES).bfloat16().float(), (3, 5), [4, 4])):
        def f(q, k, v):
            return qt.scaled_dot_product_attention(q, k, v, alibi_slopes=slopes, key_lengths=lengths,
                                                   query_lengths=rows)
        assert torch.equal(f(q, k, v), want), seed_note(7000)
        assert torch.equal(traced(f, q, k, v)(q, k, v), want), seed_note(7000)
    c = torch.tensor([0, 2, 5], dtype=torch.int32)
    qp, kp, vp = (x[0].transpose(0, 1).reshape(5, 4, 16).contiguous() for x in (q, k, v))
    assert torch.equal(qt.varlen_attention(qp, kp, vp, c, c, alibi_slopes=torch.tensor(SLOPES)),
                       qt.varlen_attention(qp, kp, vp, c, c, alibi_slopes=SLOPES))


BAD_TENSORS = [
    (dict(alibi_slopes=torch.tensor([1, 2, 3, 4])), TypeError,
     r"^alibi_slopes: dtype torch.int64 is not supported; pass a floating-point tensor \(float32\)$"),
    (dict(key_lengths=torch.tensor([3.0, 5.0])), TypeError,
     r"^key_lengths: dtype torch.float32 is not supported; pass an integer tensor \(int32 or int64\)$"),
    (dict(query_lengths=torch.tensor([True, False])), TypeError, r"^query_lengths: dtype torch.bool is not supported"),
    (dict(alibi_slopes=torch.ones(2, 2)), ValueError,
     r"^alibi_slopes: expected a 1-D tensor of one entry per query head, got shape \[2, 2\]$"),
    (dict(alibi_slopes=torch.tensor(0.5)), ValueError, r"^alibi_slopes: expected a 1-D tensor .* got shape \[\]$"),
    (dict(key_lengths=torch.ones(1, 2, dtype=torch.long)), ValueError,
     r"^key_lengths: expected a 1-D tensor of one entry per batch row, got shape \[1, 2\]$"),
    (dict(key_lengths=torch.ones(2, dtype=torch.long, device="meta")), ValueError,
     r"^key_lengths is on device 'meta': qkv.torch computes on CPU tensors only"),
    (dict(alibi_slopes=torch.ones(4, requires_grad=True)), ValueError,
     r"^alibi_slopes requires grad, but qkv computes no gradient for it; pass alibi_slopes.detach\(\)$"),
    (dict(key_lengths=torch.tensor([3, 9])), ValueError, r"key_lengths\[1\] = 9 is outside \[0, 5\]"),
    (dict(alibi_slopes=torch.ones(3)), ValueError, r"alibi_slopes: expected 4 entries"),
]


@pytest.mark.parametrize("kw,exc,message", BAD_TENSORS,
                         ids=[next(iter(b[0])) + str(i) for i, b in enumerate(BAD_TENSORS)])
def test_bad_tensor_arguments_are_refused_by_name_on_every_front_end(kw, exc, message):
    q, k, v = qkv4(7001)
    base = exc is TypeError and qt.SdpaTypeError or qt.SdpaValueError
    with pytest.raises(base, match=message):
        qt.scaled_dot_product_attention(q, k, v, **kw)
    with pytest.raises(base, match=message):  # a traced call checks them as the eager one does
        traced(lambda q, k, v: qt.scaled_dot_product_attention(q, k, v, **kw), q, k, v)
    if "alibi_slopes" in kw:
        c = torch.tensor([0, 2, 5])
        with pytest.raises(base, match=message):
            qt.varlen_attention(*(x[0, :, :, :].transpose(0, 1).reshape(5, 4, 16) for x in (q, k, v)), c, c, **kw)


def test_a_traced_call_refuses_what_the_eager_call_refuses():
    """The traced form converted its arguments with int() and bool(): key_lengths=[3.7] ran as 3 and
    is_causal='no' as True."""
    q, k, v = qkv4(7002)
    for kw, message in ((dict(key_lengths=[3.7, 5]), r"key_lengths\[0\] must be an integer, got 3.7"),
                        (dict(window=(1.5, 0)), r"window\[0\] must be an integer, got 1.5"),
                        (dict(is_causal="no"), "is_causal must be True or False, got 'no'"),
                        (dict(alibi_slopes=["x"] * 4), r"alibi_slopes\[0\] must be a number")):
        with pytest.raises(qt.SdpaTypeError, match=message):
            qt.scaled_dot_product_attention(q, k, v, **kw)
        with pytest.raises(qt.SdpaTypeError, match=message):
            traced(lambda q, k, v: qt.scaled_dot_product_attention(q, k, v, **kw), q, k, v)


@GLOO
def test_ring_takes_tensor_slopes_and_lengths():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        q, k, v = qkv4(7003, (1, 4, 9, 8))
        want = qt.ring_attention(q, k, v, causal=True, alibi_slopes=SLOPES, key_lengths=[7])
        got = qt.ring_attention(q, k, v, causal=True, alibi_slopes=torch.tensor(SLOPES), key_lengths=torch.tensor([7]))
        assert torch.equal(got, want), seed_note(7003)
        with pytest.raises(ValueError, match=r"rank 0: TypeError: key_lengths: dtype torch.float32 is not supported"):
            qt.ring_attention(q, k, v, key_lengths=torch.tensor([7.0]))
    finally:
        dist.destroy_process_group()


MASK_VALUES = [
    # (mask shape, bad index, value, the query's shape): the index is in the caller's tensor, whose
    # size-1 and missing dims qkv broadcast to [B, H, L, S] (and flattened rank-5 batch dims).
    ((5, 5), (1, 3), math.nan, (2, 4, 5, 16)),
    ((4, 1, 5), (2, 0, 4), math.inf, (2, 4, 5, 16)),
    ((2, 1, 5, 5), (1, 0, 4, 0), math.nan, (2, 4, 5, 16)),
    ((3, 1, 4, 5, 5), (2, 0, 3, 1, 2), math.nan, (3, 2, 4, 5, 16)),
    ((1, 5), (0, 2), math.nan, (5, 16)),
]


@pytest.mark.parametrize("shape,index,value,qshape", MASK_VALUES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_bad_mask_value_is_named_by_the_callers_argument_and_index(shape, index, value, qshape, dtype):
    """Before: "bias contains NaN at index (0, 0, 0, 0)": qkv's own argument name and an index of
    the [B, H, L, S] view it made of attn_mask."""
    q = torch.zeros(qshape, dtype=dtype)
    mask = torch.zeros(shape, dtype=dtype)
    mask[index] = value
    what = "NaN" if math.isnan(value) else r"\+inf"
    with pytest.raises(qt.SdpaValueError, match=rf"^attn_mask contains {what} at index \({', '.join(map(str, index))}"
                                                rf"{',' if len(index) == 1 else ''}\)$"):
        qt.scaled_dot_product_attention(q, q, q.to(dtype), attn_mask=mask)


def test_multihead_attention_names_the_mask_holding_the_bad_value():
    torch.manual_seed(0)
    mha = qt.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 5, 16)
    kpm, mask2, mask3 = torch.zeros(2, 5), torch.zeros(5, 5), torch.zeros(4, 5, 5)
    kpm[1, 3] = math.nan
    mask2[2, 4] = math.inf
    mask3[3, 1, 2] = math.nan  # batch 1, head 1
    for kw, message in ((dict(key_padding_mask=kpm), r"^key_padding_mask contains NaN at index \(1, 3\)$"),
                        (dict(attn_mask=mask2), r"^attn_mask contains \+inf at index \(2, 4\)$"),
                        (dict(attn_mask=mask3), r"^attn_mask contains NaN at index \(3, 1, 2\)$"),
                        (dict(attn_mask=torch.zeros(5, 5), key_padding_mask=kpm),
                         r"^key_padding_mask contains NaN at index \(1, 3\)$"),
                        (dict(attn_mask=mask2, key_padding_mask=torch.zeros(2, 5)),
                         r"^attn_mask contains \+inf at index \(2, 4\)$")):
        with pytest.raises(qt.MhaValueError, match=message):
            mha(x, x, x, **kw)
    with pytest.raises(qt.MhaValueError, match=r"^key_padding_mask contains NaN at index \(3,\)$"):
        mha(x[1], x[1], x[1], key_padding_mask=kpm[1])


def varlen_qkv():
    t = torch.randn(5, 4, 16)
    return t, t.clone(), t.clone(), torch.tensor([0, 2, 5], dtype=torch.int32)


VARLEN_ERRORS = [
    # Before: silently truncated to 1, "not enough values to unpack", accepted, and plain ValueError.
    (dict(window_size=(1.5, 0)), TypeError, r"^window_size\[0\] must be an integer, got 1.5$"),
    (dict(window_size=(1,)), TypeError, r"^window_size must be a pair \(left, right\), -1 = unbounded, got \(1,\)$"),
    (dict(window_size=3), TypeError, r"^window_size must be a pair"),
    (dict(dtypes=(torch.float32, torch.float16, torch.bfloat16)), TypeError,
     r"^q, k and v must share a dtype, got torch.float32, torch.float16 and torch.bfloat16$"),
    (dict(dtypes=(torch.float64,) * 3), TypeError,
     r"^q: dtype torch.float64 is not supported by qkv.torch; use float32, bfloat16 or float16 \(q.float\(\)\)$"),
    (dict(causal="no"), TypeError, r"^causal must be True or False, got 'no'$"),
    (dict(return_lse=1), TypeError, r"^return_lse must be True or False, got 1$"),
    (dict(return_attn_probs="yes"), TypeError, r"^return_attn_probs must be True or False"),
    (dict(deterministic=None), TypeError, r"^deterministic must be True or False"),
    (dict(max_seqlen_q=2.5), TypeError, r"^max_seqlen_q must be an integer, got 2.5$"),
    (dict(max_seqlen_k=2), ValueError, r"^max_seqlen_k = 2, but a sequence has 3 rows$"),
    (dict(softmax_scale="x"), TypeError, r"^softmax_scale must be a number or None, got 'x'$"),
    (dict(softmax_scale=1e300), ValueError, r"softmax_scale must be finite and at most FLT_MAX"),
    (dict(softcap=-1.0), ValueError, r"softcap must be a finite number >= 0"),
    (dict(dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
    (dict(device="meta"), ValueError, r"^k is on device 'meta'"),
    (dict(alibi_slopes=[1.0]), ValueError, r"alibi_slopes: expected 4 entries"),
]


@pytest.mark.parametrize("kw,exc,message", VARLEN_ERRORS, ids=[f"{next(iter(e[0]))}{i}" for i, e in
                                                               enumerate(VARLEN_ERRORS)])
def test_varlen_refuses_what_sdpa_refuses_with_its_classes(kw, exc, message):
    q, k, v, c = varlen_qkv()
    kw = dict(kw)
    if "dtypes" in kw:
        q, k, v = (x.to(d) for x, d in zip((q, k, v), kw.pop("dtypes")))
    if "device" in kw:
        k = torch.zeros(5, 4, 16, device=kw.pop("device"))
    with pytest.raises(exc, match=message) as e:
        qt.varlen_attention(q, k, v, c, c, **kw)
    assert isinstance(e.value, (qt.SdpaTypeError, qt.SdpaValueError)) and isinstance(e.value, RuntimeError)


def test_varlen_window_size_forms():
    """(-1, -1), None and a negative side are unbounded, as FlashAttention reads them."""
    q, k, v, c = varlen_qkv()
    full = qt.varlen_attention(q, k, v, c, c)
    assert torch.equal(qt.varlen_attention(q, k, v, c, c, window_size=None), full)
    assert torch.equal(qt.varlen_attention(q, k, v, c, c, window_size=[-1, -5]), full)
    assert torch.equal(qt.varlen_attention(q, k, v, c, c, window_size=(1, -1)),
                       qt.varlen_attention(q, k, v, c, c, window_size=(1, 99)))


def test_varlen_dropout_mask_hint_is_right_for_every_sequence():
    """The hint said dropout_mask((1, H, n_q, n_k), p, seed), true for sequence 0 only: sequence s
    is batch row s of the mask."""
    q, k, v, c = varlen_qkv()
    with pytest.raises(qt.SdpaValueError, match=r"^return_attn_probs is not supported: sequence s's dropout mask is "
                                                r"qkv.dropout_mask\(\(s \+ 1, H, n_q, n_k\), dropout_p, seed\)\[s\]"):
        qt.varlen_attention(q, k, v, c, c, return_attn_probs=True)
    p = 0.4
    torch.manual_seed(3)
    seed = int(torch.empty((), dtype=torch.int64).random_())
    torch.manual_seed(3)
    out = qt.varlen_attention(q, k, v, c, c, dropout_p=p)
    for s in range(2):
        a, b = int(c[s]), int(c[s + 1])
        w = torch.softmax(torch.einsum("nhd,mhd->hnm", q[a:b], k[a:b]) / 4, -1)
        keep = torch.from_numpy(qkv.dropout_mask((s + 1, 4, b - a, b - a), p, seed)[s])
        ref = torch.einsum("hnm,mhd->nhd", w * keep / (1 - p), v[a:b])
        assert (out[a:b] - ref).abs().max() <= 2e-5 * (1 + ref.abs().max()), s


def test_return_lse_with_empty_dimensions_agrees_with_out_alone():
    """return_lse=True raised "value head dim Dv must be at least 1" (and refused zero heads) where
    the call without it returns an empty tensor: now out is that same empty tensor, and lse is
    what it is: empty with no heads, and with a value dim of 0 the log-sum-exp of the scores,
    which v does not enter."""
    q, k, v = qkv4(7004)
    q.requires_grad_()
    v0 = v[..., :0].clone().requires_grad_()
    out, lse = qt.scaled_dot_product_attention(q, k, v0, is_causal=True, return_lse=True)
    assert out.shape == (2, 4, 5, 0) and torch.equal(out, qt.scaled_dot_product_attention(q, k, v0, is_causal=True))
    assert torch.equal(lse, qt.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)[1])
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q)) and v0.grad.shape == v0.shape
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        h0 = torch.zeros(2, 0, 5, 16, dtype=dtype)
        out, lse = qt.scaled_dot_product_attention(h0, h0, h0, return_lse=True)
        assert out.shape == (2, 0, 5, 16) and out.dtype == dtype
        assert lse.shape == (2, 0, 5) and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
