"""qkv.SGD / qkv.AdamW against torch.optim, and a short training run through forward/backward."""

import numpy as np
import pytest
import torch

import qkv
from py_oracle import rng_for, seed_note



def _grads(layer, rng):
    return {name: rng.standard_normal(w.shape).astype(np.float32) for name, w in layer.parameters().items()}


@pytest.mark.parametrize("kind, kwargs, torch_cls, torch_kwargs", [
    ("sgd", dict(lr=0.05, momentum=0.0), torch.optim.SGD, dict(lr=0.05)),
    ("sgd", dict(lr=0.05, momentum=0.9, weight_decay=0.01), torch.optim.SGD,
     dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("adamw", dict(lr=0.01, weight_decay=0.0), torch.optim.AdamW, dict(lr=0.01, weight_decay=0.0)),
    # torch.optim's defaults (they were momentum 0.9 and weight decay 0, unlike torch's).
    ("sgd", dict(lr=0.05), torch.optim.SGD, dict(lr=0.05)),
    ("adamw", dict(), torch.optim.AdamW, dict()),
    ("adamw", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), torch.optim.AdamW,
     dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
])
def test_steps_match_torch_optim(kind, kwargs, torch_cls, torch_kwargs):
    case = 9000 + len(str(kwargs))
    rng = rng_for(case)
    layer = qkv.MultiHeadAttention(6, 2, bias=True, seed=4)
    params = {n: torch.tensor(w.copy(), requires_grad=True) for n, w in layer.parameters().items()}
    opt = (qkv.SGD if kind == "sgd" else qkv.AdamW)(layer, **kwargs)
    topt = torch_cls(list(params.values()), **torch_kwargs)
    for _ in range(5):
        grads = _grads(layer, rng)
        opt.step(grads)
        for n, p in params.items():
            p.grad = torch.from_numpy(grads[n])
        topt.step()
    assert opt.step_count == 5
    for n, p in params.items():
        np.testing.assert_allclose(getattr(layer, n), p.detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"{n} {kind} {seed_note(case)}")


def test_training_reduces_the_loss():
    rng = rng_for(9100)
    teacher = qkv.MultiHeadAttention(8, 2, seed=1)
    student = qkv.MultiHeadAttention(8, 2, seed=2)
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    target = teacher.forward(x, causal=True)
    opt = qkv.AdamW(student, lr=0.02)
    losses = []
    for step in range(60):
        y = student.forward(x, causal=True)
        losses.append(float(np.mean((y - target) ** 2)))
        student.backward(2 * (y - target) / y.size)
        norm = qkv.clip_grad_norm(student, 1.0)
        assert norm > 0
        opt.step(lr=qkv.lr_at(step, base=0.02, warmup=5, total=60))
    assert losses[-1] < 0.2 * losses[0], f"loss {losses[0]:.4g} -> {losses[-1]:.4g} ({seed_note(9100)})"


def test_state_round_trip_and_clipping():
    rng = rng_for(9200)
    layer = qkv.MultiHeadAttention(4, 1, seed=0)
    opt = qkv.AdamW(layer, lr=0.1)
    opt.step(_grads(layer, rng))
    state = opt.state()
    assert sorted(state) == sorted(f"adamw.{m}.{n}" for m in "mv" for n in ("w_q", "w_k", "w_v", "w_o"))
    other = qkv.AdamW(qkv.MultiHeadAttention(4, 1, seed=0), lr=0.1)
    other.load_state(state, opt.step_count)
    assert other.step_count == 1 and all(np.array_equal(other.state()[k], v) for k, v in state.items())
    x = rng.standard_normal((3, 4)).astype(np.float32)
    layer.forward(x)
    layer.backward(np.ones((3, 4), np.float32) * 100)
    before = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in layer.grads.values()))
    assert qkv.clip_grad_norm(layer, 0.5) == pytest.approx(before, rel=1e-6)
    after = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in layer.grads.values()))
    assert after == pytest.approx(0.5, rel=1e-5)
    assert qkv.lr_at(0, base=1.0, warmup=4, total=10) == pytest.approx(0.25)
    assert qkv.lr_at(10, base=1.0, min_lr=0.1, warmup=4, total=10) == pytest.approx(0.1)


def test_optimizer_bad_inputs():
    layer = qkv.MultiHeadAttention(4, 1)
    with pytest.raises(ValueError, match="step: the layer has no gradients"):
        qkv.SGD(layer, lr=0.1).step()
    grads = _grads(layer, rng_for(9300))
    del grads["w_o"]
    opt = qkv.AdamW(layer)
    before = layer.w_q.copy()
    with pytest.raises(ValueError, match="w_o"):
        opt.step(grads)
    assert np.array_equal(layer.w_q, before), "a refused step changes nothing"
    with pytest.raises(ValueError, match="kind must be 'sgd' or 'adamw'"):
        qkv.Optimizer(layer, kind="lion")
    with pytest.raises(ValueError):
        qkv.AdamW(layer, betas=(1.5, 0.9))
    with pytest.raises(ValueError, match="lr must be >= 0"):
        qkv.SGD(layer, lr=-1.0)
    with pytest.raises(TypeError):
        qkv.SGD("not a layer", lr=0.1)
    # A name the optimizer does not know (a misspelt parameter, a state entry of another layer) was
    # ignored: that parameter was never updated, or that moment never restored.
    grads = _grads(layer, rng_for(9301))
    grads["w_qq"] = grads["w_q"]
    with pytest.raises(ValueError, match=r"step: grads: 'w_qq' is not one of this optimizer's names \(w_q, w_k, w_v, "
                                         r"w_o\)"):
        opt.step(grads)
    assert np.array_equal(layer.w_q, before)
    state = opt.state()
    state["adamw.m.b_q"] = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"load_state: 'adamw.m.b_q' is not one of this optimizer's names"):
        opt.load_state(state, 3)
    assert opt.step_count == 0


def test_optimizer_values_that_would_make_nan_weights_are_refused():
    """Each of these was taken and then turned every weight into NaN (or wrapped the step count,
    or skipped clipping) without a word: refused by name, before anything changes."""
    layer = qkv.MultiHeadAttention(4, 1)
    grads = _grads(layer, rng_for(9400))
    for make, exc, message in [
            (lambda: qkv.SGD(layer, lr=np.inf), ValueError, "lr must be >= 0 and finite, got inf"),
            (lambda: qkv.SGD(layer, lr=True), TypeError, "lr must be a number, got True"),
            (lambda: qkv.SGD(layer, lr="0.1"), TypeError, "lr must be a number, got '0.1'"),
            (lambda: qkv.AdamW(layer, weight_decay=np.inf), ValueError, "weight decay inf finite and >= 0"),
            (lambda: qkv.AdamW(layer, betas=5), TypeError, r"betas must be a pair \(beta1, beta2\), got 5"),
            (lambda: qkv.Optimizer(layer, kind=None), TypeError, "kind must be a string, got None")]:
        with pytest.raises(exc, match=message):
            make()
    before = layer.w_q.copy()
    with pytest.raises(ValueError, match="learning rate 1e\\+300 times weight decay 1e\\+300 is not finite"):
        qkv.AdamW(layer, lr=1e300, weight_decay=1e300).step(grads)
    opt = qkv.AdamW(layer)
    with pytest.raises(TypeError, match="lr must be a number, got '0.1'"):
        opt.step(grads, lr="0.1")
    with pytest.raises(TypeError, match=r"grads must be a dict \{name: array\} or None, got \[1, 2\]"):
        opt.step([1, 2])
    with pytest.raises(TypeError, match="a tensor name must be a string, got 1"):
        opt.step({**grads, 1: np.zeros(3, np.float32)})
    with pytest.raises(TypeError, match="lr must be a number, got None"):
        opt.lr = None
    state = opt.state()
    with pytest.raises(ValueError, match=r"optimizer state: adamw.m.w_q has nan at flat index 0; it must be finite"):
        opt.load_state({k: v * np.nan for k, v in state.items()}, 1)
    with pytest.raises(ValueError, match=r"adamw.v.w_q has -1 at flat index 0; it must be finite and >= 0"):
        opt.load_state({k: (-np.ones_like(v) if ".v." in k else v) for k, v in state.items()}, 1)
    with pytest.raises(ValueError, match=r"step count 9223372036854775807 is outside \[0, 2\^62\]"):
        opt.load_state(state, (1 << 63) - 1)
    with pytest.raises(TypeError, match="step_count must be an integer, got 1.5"):
        opt.load_state(state, 1.5)
    for kind in ("sgd", "adamw"):  # finite, yet the step passes float32: it wrote -inf weights
        with pytest.raises(ValueError, match=r"learning rate 1e\+308 takes w_\w past float32's range at flat index "
                                             r"\d+ .*; nothing was updated"):
            qkv.Optimizer(layer, kind=kind, lr=1e308).step(grads)
    assert np.array_equal(layer.w_q, before), "refused calls change nothing"
    layer(np.ones((3, 4), np.float32))
    layer.backward(np.ones((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"clip_grad_norm: max_norm is NaN"):
        qkv.clip_grad_norm(layer, np.nan)
    with pytest.raises(ValueError, match="lr schedule: step -5, warmup 10 and total 1 must be >= 0"):
        qkv.lr_at(-5, warmup=10)
    with pytest.raises(ValueError, match="need 0 <= min_lr <= base, both finite; got min_lr 1, base 0.1"):
        qkv.lr_at(5, base=0.1, min_lr=1.0)
    with pytest.raises(TypeError, match="step must be an integer, got True"):
        qkv.lr_at(True)
