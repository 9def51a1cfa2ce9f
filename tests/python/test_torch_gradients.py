"""What qkv.torch does with gradients beyond dL/dq, dk, dv of out: a loss term on lse (return_lse),
and second-order gradients, on every front end (scaled_dot_product_attention, varlen_attention,
MultiheadAttention, ring_attention over a one-rank gloo group). qkv computes neither, so using
either raises RuntimeError: never a silently dropped term (both were dropped before), and the
first-order gradients stay the same numbers.
"""

import pytest
import torch
import torch.distributed as dist

import qkv.torch as qt

SECOND_ORDER = "qkv.torch: second-order gradients are not supported"
LSE_TERM = "a loss term uses lse, whose gradient qkv does not compute; detach lse"
GLOO = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                          reason="ring_attention needs torch.distributed with gloo")


def lse_front_ends():
    """(name, call) pairs: call(q, k, v) -> (out, lse) of a front end that returns lse."""
    cu = torch.tensor([0, 2, 5])
    return [
        ("sdpa float32", lambda q, k, v: qt.scaled_dot_product_attention(q, k, v, return_lse=True)),
        ("sdpa causal", lambda q, k, v: qt.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)),
        ("sdpa float64", lambda q, k, v: qt.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                                         return_lse=True)),
        ("sdpa bfloat16", lambda q, k, v: qt.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                                                          return_lse=True)),
        ("sdpa float16", lambda q, k, v: qt.scaled_dot_product_attention(q.half(), k.half(), v.half(),
                                                                         return_lse=True)),
        ("varlen", lambda q, k, v: qt.varlen_attention(q, k, v, cu, cu, causal=True, return_lse=True)),
    ]


@pytest.mark.parametrize("name,call", lse_front_ends(), ids=[c[0] for c in lse_front_ends()])
def test_a_loss_term_on_lse_raises_instead_of_being_dropped(name, call):
    """A z-loss on lse, (out.sum() + 1e-2 * lse.square().sum()).backward(), gave the gradient of
    out.sum() alone: lse was marked non-differentiable, so its term was a constant. qkv's kernels
    take no lse gradient, so the term is refused; lse.detach() makes it a constant on purpose, and a
    term whose gradient is 0 is none."""
    q, k, v = (torch.randn(5, 2, 8, requires_grad=True) for _ in range(3))
    out, lse = call(q, k, v)
    assert lse.requires_grad and lse.dtype in (torch.float32, torch.float64), name
    with pytest.raises(RuntimeError, match=LSE_TERM):
        (out.float().sum() + 1e-2 * lse.square().sum()).backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=LSE_TERM):
        lse.sum().backward(retain_graph=True)
    assert q.grad is None
    (out.float().sum() + 1e-2 * lse.detach().square().sum() + 0 * lse.sum()).backward()
    want = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    call(*want)[0].float().sum().backward()
    assert all(torch.equal(x.grad, w.grad) for x, w in zip((q, k, v), want)), name


def second_order_cases():
    """(name, make) pairs: make() returns (loss, the inputs whose gradients are penalised)."""
    def sdpa(dtype):
        def make():
            q, k, v = (torch.randn(1, 2, 3, 5, dtype=dtype, requires_grad=True) for _ in range(3))
            return (qt.scaled_dot_product_attention(q, k, v, is_causal=True) ** 2).sum(), [q, k, v]
        return make

    def lse():  # lse detached: a constant in the loss, and the gradient penalty still raises
        q, k, v = (torch.randn(1, 2, 3, 5, requires_grad=True) for _ in range(3))
        out, lse = qt.scaled_dot_product_attention(q, k, v, return_lse=True)
        return (out ** 2).sum() + lse.detach().square().sum(), [q, k]

    def mask():
        q, k, v = (torch.randn(1, 2, 3, 5) for _ in range(3))
        m = torch.randn(3, 3, requires_grad=True)
        return (qt.scaled_dot_product_attention(q, k, v, attn_mask=m) ** 2).sum(), [m]

    def varlen():
        q = torch.randn(5, 2, 4, requires_grad=True)
        k = torch.randn(5, 2, 4, requires_grad=True)
        out = qt.varlen_attention(q, k, k, torch.tensor([0, 2, 5]), torch.tensor([0, 3, 5]))
        return (out ** 2).sum(), [q, k]

    def mha():
        torch.manual_seed(5)
        m = qt.MultiheadAttention(8, 2, batch_first=True)
        x = torch.randn(2, 4, 8, requires_grad=True)
        out, _ = m(x, x, x, need_weights=False)
        return (out ** 2).sum(), [x, m.in_proj_weight]

    return [("sdpa float32", sdpa(torch.float32)), ("sdpa float64", sdpa(torch.float64)),
            ("sdpa bfloat16", sdpa(torch.bfloat16)), ("sdpa lse", lse), ("sdpa mask", mask), ("varlen", varlen),
            ("mha", mha)]


@pytest.mark.parametrize("name,make", second_order_cases(), ids=[c[0] for c in second_order_cases()])
def test_second_order_gradients_raise_on_every_front_end(name, make):
    """A gradient penalty: g = grad(loss, xs, create_graph=True), then loss + |g|^2 differentiated.
    Before, the penalty term was silently dropped (grad(penalty, xs, allow_unused=True) gave None):
    the error node hung off fresh leaves that no path from the inputs reached."""
    loss, xs = make()
    first = torch.autograd.grad(loss, xs, retain_graph=True)
    gs = torch.autograd.grad(loss, xs, create_graph=True)
    assert all(g.requires_grad for g in gs)
    assert all(torch.equal(g.detach(), f) for g, f in zip(gs, first)), name  # the same first-order numbers
    penalty = sum(g.float().square().sum() for g in gs)
    with pytest.raises(RuntimeError, match=SECOND_ORDER):
        torch.autograd.grad(loss + penalty, xs[0], retain_graph=True)
    with pytest.raises(RuntimeError, match=SECOND_ORDER):
        torch.autograd.grad(penalty, xs, allow_unused=True, retain_graph=True)
    with pytest.raises(RuntimeError, match=SECOND_ORDER):
        penalty.backward()


def test_gradgradcheck_raises_instead_of_reporting_a_mismatch():
    q, k, v = (torch.randn(1, 2, 3, 5, dtype=torch.float64, requires_grad=True) for _ in range(3))
    with pytest.raises(RuntimeError, match=SECOND_ORDER):
        torch.autograd.gradgradcheck(qt.scaled_dot_product_attention, (q, k, v))
    # gradgradcheck also differentiates the gradients with respect to the output's gradient.
    x = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    out = qt.scaled_dot_product_attention(x, x, x)
    dout = torch.ones_like(out, requires_grad=True)
    (g,) = torch.autograd.grad(out, x, dout, create_graph=True)
    with pytest.raises(RuntimeError, match=SECOND_ORDER):
        torch.autograd.grad(g.sum(), dout)


@pytest.fixture
def one_rank_group():
    """A one-process gloo group, as torchrun's two ranks have it but in this process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@GLOO
def test_ring_second_order_and_lse_raise(one_rank_group):
    q, k, v = (torch.randn(2, 7, 8, requires_grad=True) for _ in range(3))
    out = qt.ring_attention(q, k, v, causal=True)
    (g,) = torch.autograd.grad((out ** 2).sum(), q, create_graph=True)
    assert torch.equal(g.detach(), torch.autograd.grad((qt.ring_attention(q, k, v, causal=True) ** 2).sum(), q)[0])
    with pytest.raises(RuntimeError, match=SECOND_ORDER):
        torch.autograd.grad((out ** 2).sum() + g.square().sum(), q)
    out, lse = qt.ring_attention(q, k, v, return_lse=True)
    with pytest.raises(RuntimeError, match="ring_attention: rank 0: " + LSE_TERM):
        (out.sum() + lse.square().sum()).backward()
    out, lse = qt.ring_attention(q, k, v, return_lse=True)
    (out.sum() + 0 * lse.sum()).backward()  # a zero gradient on lse is no term
    assert torch.isfinite(q.grad).all()
