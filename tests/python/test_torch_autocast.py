"""qkv.torch inside torch.autocast("cpu", dtype=torch.bfloat16), where a PyTorch user trains in
bfloat16: q, k and v reach attention in mixed dtypes (a Linear's bfloat16 output beside a float32
rotary product or memory). scaled_dot_product_attention and varlen_attention take them in
autocast's dtype, as PyTorch's function does; MultiheadAttention runs as torch.nn's does. Each
against the same call on inputs cast by hand, and against torch's own module under autocast by
FlashAttention's rule (vs float64)."""

import pytest
import torch

import qkv.torch as qt
from py_oracle import rng_for, seed_note


def _mixed(seed, shapes):
    """Float32 leaves, one of which reaches attention through a bfloat16 op (as a Linear's output)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("seed", [11, 12])
def test_sdpa_and_varlen_take_mixed_dtypes_in_autocasts_dtype(seed):
    q, k, v = _mixed(seed, [(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = qt.scaled_dot_product_attention(q, k, v.bfloat16(), is_causal=True, dropout_p=0.0)
    assert out.dtype == torch.bfloat16, seed_note(seed)
    want = qt.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    assert torch.equal(out, want), seed_note(seed)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    want_grads = torch.autograd.grad(want.float().sum(), (q, k, v))
    assert all(g.dtype == torch.float32 and torch.equal(g, w) for g, w in zip(grads, want_grads)), seed_note(seed)

    q, k, v = _mixed(seed, [(9, 2, 8), (9, 2, 8), (9, 2, 8)])
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = qt.varlen_attention(q, k.bfloat16(), v, cu, cu, causal=True)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, qt.varlen_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu, cu, causal=True))
    # Outside autocast, mixed dtypes are still refused by name.
    with pytest.raises(qt.SdpaTypeError, match="must share a dtype"):
        qt.scaled_dot_product_attention(q, k.bfloat16(), v)


@pytest.mark.parametrize("case", ["self", "cross, bias_kv", "bf16 module"])
def test_multihead_attention_runs_under_autocast_as_torchs_does(case):
    seed = 31 + ["self", "cross, bias_kv", "bf16 module"].index(case)
    rng = rng_for(seed)
    torch.manual_seed(int(rng.integers(1 << 30)))
    # Sizes whose max errors are maxima over many elements: with E = 16 and 2 x 5 tokens the bf16
    # module's d in_proj_weight missed the rule in 9 seeds of 200 (2-3 bf16 steps against torch's
    # 1, a handful of elements deciding), while qkv's own gradients of q, k and v at that size read
    # 0.2 of torch's error (median, 900 tensors) and never past the rule. Here: none in 150.
    E, H = 64, 4
    proj = torch.nn.Linear(E, E)
    x, enc = torch.randn(4, 33, E), torch.randn(4, 17, E)
    ours = qt.MultiheadAttention(E, H, batch_first=True, add_bias_kv=case == "cross, bias_kv")
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=case == "cross, bias_kv")
    theirs.load_state_dict(ours.state_dict())
    exact = torch.nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=case == "cross, bias_kv").double()
    exact.load_state_dict(ours.state_dict())
    if case == "bf16 module":
        ours, theirs = ours.bfloat16(), theirs.bfloat16()

    def run(module, autocast=True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            h = proj(x)  # bfloat16 under autocast
            args = (h, h, h) if case == "self" else (h, proj(enc), proj(enc)) if case != "bf16 module" else (x, x, x)
            if not autocast:
                args = tuple(a.double() for a in args)
            out, _ = module(*args, need_weights=False)
        (out.float() ** 2).sum().backward()
        first = module.in_proj_weight.grad.double().clone()
        module.zero_grad()
        proj.zero_grad()
        return out, first

    out, grad = run(ours)
    out_pt, grad_pt = run(theirs)
    ref, grad_ref = run(exact, autocast=False)
    assert out.dtype == out_pt.dtype == torch.bfloat16, case
    for name, got, peer, want in (("out", out, out_pt, ref), ("d in_proj_weight", grad, grad_pt, grad_ref)):
        err = float((got.double() - want).abs().max())
        err_pt = float((peer.double() - want).abs().max())
        assert err <= 2 * err_pt + 1e-5, f"{case} {name}: {err:.3g} against torch's {err_pt:.3g} ({seed_note(seed)})"
