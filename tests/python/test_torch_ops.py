"""qkv.torch as PyTorch operators: torch.jit.trace and torch.jit.script of models using
scaled_dot_product_attention, MultiheadAttention and varlen_attention give graphs that call qkv::
operators, run bitwise like eager mode, save and load, and differentiate: gradcheck in float64
(qkv's float64 reference kernels) for every option through the scripted and the traced call.
"""

import io
from typing import List, Optional

import pytest
import torch

import qkv.torch as qt

torch.manual_seed(0)


def scripted_sdpa(q, k, v, attn_mask: Optional[torch.Tensor], is_causal: bool, scale: Optional[float],
                  enable_gqa: bool, window: Optional[List[int]], alibi_slopes: Optional[List[float]],
                  softcap: Optional[float], key_lengths: Optional[List[int]], query_lengths: Optional[List[int]],
                  causal_align: str):
    return qt.scaled_dot_product_attention(q, k, v, attn_mask, 0.0, is_causal, scale, enable_gqa, window=window,
                                           alibi_slopes=alibi_slopes, softcap=softcap, key_lengths=key_lengths,
                                           query_lengths=query_lengths, causal_align=causal_align)


SCRIPTED = torch.jit.script(scripted_sdpa)
NO_OPTIONS = dict(attn_mask=None, is_causal=False, scale=None, enable_gqa=False, window=None, alibi_slopes=None,
                  softcap=None, key_lengths=None, query_lengths=None, causal_align="top_left")

# Every option of the operator, each on its own (B = 2, H = 2, L = 5, S = 7).
OPTIONS = {
    "plain": {},
    "causal": dict(is_causal=True),
    "causal_bottom_right": dict(is_causal=True, causal_align="bottom_right"),
    "window": dict(window=[2, 1]),
    "window_one_sided": dict(window=[3, -1], causal_align="bottom_right"),
    "alibi": dict(alibi_slopes=[0.5, 0.25]),
    "softcap": dict(softcap=2.0),
    "scale": dict(scale=0.7),
    "gqa": dict(enable_gqa=True),
    "key_lengths": dict(key_lengths=[4, 7]),
    "query_lengths": dict(query_lengths=[3, 5], is_causal=True),
    "bool_mask": dict(attn_mask="bool"),
    "float_mask": dict(attn_mask="float"),
}


def inputs(name, dtype=torch.float64):
    Hkv = 1 if name == "gqa" else 2
    q = torch.randn(2, 2, 5, 4, dtype=dtype, requires_grad=True)
    k = torch.randn(2, Hkv, 7, 4, dtype=dtype, requires_grad=True)
    v = torch.randn(2, Hkv, 7, 3, dtype=dtype, requires_grad=True)
    opts = dict(NO_OPTIONS, **OPTIONS[name])
    if opts["attn_mask"] == "bool":
        opts["attn_mask"] = torch.rand(2, 1, 5, 7) < 0.7
        opts["attn_mask"][..., 0] = True
    elif opts["attn_mask"] == "float":
        # Multiples of 2^-12, so that gradcheck's steps of 2^-10 survive qkv's rounding of a float
        # mask to float32 exactly (the default step of 1e-6 would not).
        opts["attn_mask"] = (torch.randn(1, 2, 5, 7, dtype=dtype) * 4096).round().div(4096).requires_grad_()
    return (q, k, v), opts


def eager(q, k, v, opts):
    return scripted_sdpa(q, k, v, **opts)


@pytest.mark.parametrize("name", OPTIONS)
def test_scripted_and_traced_calls_are_qkv_operators_and_match_eager_bitwise(name):
    (q, k, v), opts = inputs(name, torch.float32)
    if opts["attn_mask"] is not None:  # a trace keeps it as a constant
        opts["attn_mask"] = opts["attn_mask"].detach()
    want = eager(q, k, v, opts)
    assert torch.equal(SCRIPTED(q, k, v, **opts), want)
    traced = torch.jit.trace(lambda q, k, v: eager(q, k, v, opts), (q, k, v))
    assert "qkv::scaled_dot_product_attention" in str(traced.graph)
    assert torch.equal(traced(q, k, v), want)


def test_the_scripted_graph_calls_the_operator():
    assert "qkv::scaled_dot_product_attention" in str(SCRIPTED.graph)


@pytest.mark.parametrize("name", OPTIONS)
def test_gradcheck_float64_through_the_scripted_and_traced_operator(name):
    (q, k, v), opts = inputs(name)
    tensors = (q, k, v)
    mask = opts.pop("attn_mask")
    eps = 1e-6
    if mask is not None and mask.dtype != torch.bool:
        tensors += (mask,)
        fn = lambda q, k, v, m: SCRIPTED(q, k, v, m, **opts)  # noqa: E731
        eps = 2.0 ** -10
    else:
        fn = lambda q, k, v: SCRIPTED(q, k, v, mask, **opts)  # noqa: E731
    assert torch.autograd.gradcheck(fn, tensors, eps=eps)
    traced = torch.jit.trace(fn, tensors)
    assert torch.autograd.gradcheck(traced, tensors, eps=eps)


class Block(torch.nn.Module):
    """A transformer block using both entry points, as a model would."""

    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.attn = qt.MultiheadAttention(dim, heads, batch_first=True)
        self.proj = torch.nn.Linear(dim, 3 * dim)
        self.heads = heads

    def forward(self, x):
        y, _ = self.attn(x, x, x, need_weights=False)
        q, k, v = self.proj(x + y).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)
        out = qt.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).flatten(-2)


@pytest.mark.parametrize("compile", ["trace", "script"])
def test_a_model_traces_and_scripts_and_its_gradients_match_eager(compile):
    model = Block()
    x = torch.randn(2, 6, 16)
    compiled = torch.jit.trace(model, (x,)) if compile == "trace" else torch.jit.script(model)
    graph = str(compiled.inlined_graph)
    assert "qkv::multihead_attention" in graph and "qkv::scaled_dot_product_attention" in graph
    want = model(x)
    want.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = compiled(x)
    assert torch.equal(got, want)
    got.square().sum().backward()
    for g, p in zip(grads, model.parameters()):
        assert torch.equal(p.grad, g)
    # Saved and loaded (the operators are registered by `import qkv.torch`).
    buffer = io.BytesIO()
    torch.jit.save(compiled, buffer)
    buffer.seek(0)
    assert torch.equal(torch.jit.load(buffer)(x), want)


@pytest.mark.parametrize("compile", ["trace", "script"])
def test_multihead_attention_weights_and_gradcheck_float64(compile):
    mha = qt.MultiheadAttention(8, 2, batch_first=False).double()
    x = torch.randn(5, 2, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5).double()
    compiled = torch.jit.trace(mha, (x, x, x)) if compile == "trace" else torch.jit.script(mha)
    assert "qkv::multihead_attention" in str(compiled.inlined_graph)
    out, weights = compiled(x, x, x)
    want_out, want_weights = mha(x, x, x)
    assert torch.equal(out, want_out) and torch.equal(weights, want_weights)
    if compile == "script":
        out, weights = compiled(x, x, x, attn_mask=mask, need_weights=False)
        assert weights is None and torch.equal(out, mha(x, x, x, attn_mask=mask, need_weights=False)[0])
    params = tuple(p for p in mha.parameters())
    assert torch.autograd.gradcheck(lambda x, *_: compiled(x, x, x)[0], (x,) + params)


def test_return_lse_traces_as_the_lse_overload():
    q = torch.randn(1, 2, 5, 4)
    traced = torch.jit.trace(lambda q: qt.scaled_dot_product_attention(q, q, q, return_lse=True), (q,))
    assert "qkv::scaled_dot_product_attention" in str(traced.graph)
    out, lse = traced(q)
    want_out, want_lse = qt.scaled_dot_product_attention(q, q, q, return_lse=True)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_errors_inside_a_scripted_call_name_the_argument():
    q = torch.randn(1, 2, 5, 4)
    with pytest.warns(RuntimeWarning, match=r"qkv::scaled_dot_product_attention: SdpaValueError: alibi_slopes: "
                                            r"expected 2 entries"):
        with pytest.raises(RuntimeError):
            SCRIPTED(q, q, q, **dict(NO_OPTIONS, alibi_slopes=[1.0]))
    with pytest.raises(qt.SdpaValueError, match="alibi_slopes: expected 2 entries"):
        torch.jit.trace(lambda q: qt.scaled_dot_product_attention(q, q, q, alibi_slopes=[1.0]), (q,))


def test_a_traced_call_takes_numpy_slopes_and_lengths_as_eager_does():
    import numpy as np
    q = torch.randn(2, 2, 5, 4)
    call = dict(alibi_slopes=np.array([0.5, 0.25]), key_lengths=np.array([3, 5]), is_causal=True)
    traced = torch.jit.trace(lambda q: qt.scaled_dot_product_attention(q, q, q, **call), (q,))
    assert torch.equal(traced(q), qt.scaled_dot_product_attention(q, q, q, **call))


def test_one_length_for_every_row_does_not_freeze_the_traced_batch_size():
    """One int as key_lengths / query_lengths was recorded as a list of the traced batch's B entries,
    so the graph refused any other batch size; it goes in as the schema's key_length / query_length."""
    def call(q):
        return qt.scaled_dot_product_attention(q, q, q, is_causal=True, key_lengths=3, query_lengths=4)
    traced = torch.jit.trace(call, (torch.randn(2, 2, 5, 4),))
    buf = io.BytesIO()
    torch.jit.save(traced, buf)
    buf.seek(0)
    for fn in (traced, torch.jit.load(buf)):
        for B in (1, 3):
            q = torch.randn(B, 2, 5, 4)
            assert torch.equal(fn(q), call(q))
    q = torch.randn(3, 2, 5, 4)
    with pytest.raises(qt.SdpaValueError, match="give key_lengths or key_length, not both"):
        torch.ops.qkv.scaled_dot_product_attention(q, q, q, key_lengths=[3, 3, 3], key_length=3)


def varlen(q, k, v, cu_q, cu_k):
    return qt.varlen_attention(q, k, v, cu_q, cu_k, causal=True, window_size=(5, -1), softcap=3.0)


@pytest.mark.parametrize("compile", ["trace", "script"])
def test_varlen_is_an_operator_whose_offsets_and_seed_are_not_frozen(compile):
    """A traced varlen_attention recorded a Python node with cu_seqlens and the dropout seed as
    constants: other offsets of the same total gave silently wrong outputs (by up to 1.9) and every
    call dropped one mask; such a graph could not be saved. Now one qkv::varlen_attention node."""
    q, k, v = (torch.randn(10, 2, 8, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    compiled = torch.jit.trace(varlen, (q, k, v, cu, cu)) if compile == "trace" else torch.jit.script(varlen)
    assert "qkv::varlen_attention" in str(compiled.graph)
    buf = io.BytesIO()
    torch.jit.save(compiled, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    other = torch.tensor([0, 7, 10], dtype=torch.int64)
    want = varlen(q, k, v, other, other)
    want_grads = torch.autograd.grad(want.sum(), (q, k, v))
    for fn in (compiled, loaded):
        got = fn(q, k, v, other, other)
        assert torch.equal(got, want)
        grads = torch.autograd.grad(got.sum(), (q, k, v))
        assert all(torch.equal(a, b) for a, b in zip(grads, want_grads))

    def dropped(q, k, v, cu_q, cu_k):
        return qt.varlen_attention(q, k, v, cu_q, cu_k, dropout_p=0.5)
    x = q.detach()
    traced = torch.jit.trace(dropped, (x, x, x, cu, cu), check_trace=False)
    assert not torch.equal(traced(x, x, x, cu, cu), traced(x, x, x, cu, cu))  # a seed drawn per call
    torch.manual_seed(5)
    first = traced(x, x, x, cu, cu)
    torch.manual_seed(5)
    assert torch.equal(first, dropped(x, x, x, cu, cu))
