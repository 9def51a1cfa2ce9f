"""qkv.torch.MultiheadAttention against torch.nn.MultiheadAttention carrying the same weights.

The oracle is torch.nn.MultiheadAttention in float64 (its parameters copied from the float32 module
both layers load); forward outputs must be within 2e-5 * (1 + max|ref|) of it and gradients (of the
inputs and of every parameter) within the house bound 2 * max|g_pt - ref| + 1e-5, where g_pt comes
from torch.nn.MultiheadAttention in float32. Random cases avoid fully masked rows, where PyTorch gives
NaN (qkv gives 0: tested on its own). Seeds: QKV_TEST_SEED=<seed> case=<n> in every message.
"""

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import qkv.torch as qt
from py_oracle import rng_for, seed_note


def random_case(case):
    rng = rng_for(case)
    H = int(rng.choice([1, 2, 4]))
    E = H * int(rng.choice([2, 5, 8, 10]))
    self_attn = rng.random() < 0.4
    kw = dict(bias=bool(rng.random() < 0.8), add_bias_kv=bool(rng.random() < 0.2),
              add_zero_attn=bool(rng.random() < 0.2), batch_first=bool(rng.random() < 0.5))
    if not self_attn and rng.random() < 0.4:
        kw.update(kdim=int(rng.integers(1, 12)), vdim=int(rng.integers(1, 12)))
    N, L = int(rng.integers(1, 4)), int(rng.integers(1, 20))
    S = L if self_attn else int(rng.integers(1, 20))
    batched = rng.random() < 0.8
    t = lambda *s: torch.from_numpy(rng.standard_normal(s)).float()  # noqa: E731

    def seq(length, dim):
        if not batched:
            return t(length, dim)
        return t(N, length, dim) if kw["batch_first"] else t(length, N, dim)

    query = seq(L, E)
    key, value = (query, query) if self_attn else (seq(S, kw.get("kdim", E)), seq(S, kw.get("vdim", E)))
    fwd = dict(need_weights=bool(rng.random() < 0.5), average_attn_weights=bool(rng.random() < 0.5))
    kind = rng.choice(["none", "bool", "float", "causal"] if self_attn else ["none", "bool", "float"])
    shape = (L, S) if not batched or rng.random() < 0.5 else (N * H, L, S)
    if kind == "bool":
        m = torch.from_numpy(rng.random(shape) < 0.4)
        m[..., 0] = False  # True = not allowed; key 0 stays allowed so no row is fully masked
        fwd["attn_mask"] = m
    elif kind == "float":
        fwd["attn_mask"] = t(*shape)
    elif kind == "causal":
        fwd["attn_mask"] = torch.triu(torch.full((L, L), -math.inf), diagonal=1)
        fwd["is_causal"] = True
    # A float key_padding_mask is added (PyTorch >= 2.0); torch 1.13 treats it differently, so it is
    # tested on its own below.
    kpm = rng.choice(["none", "bool"])
    kpm_shape = (N, S) if batched else (S,)
    if kpm == "bool":
        m = torch.from_numpy(rng.random(kpm_shape) < 0.4)
        m[..., 0] = False
        fwd["key_padding_mask"] = m
    torch.manual_seed(int(rng.integers(0, 2**31)))
    ref = torch.nn.MultiheadAttention(E, H, **kw)
    if kw["bias"]:
        with torch.no_grad():  # torch zero-initializes biases; random ones test that they are used
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    ours = qt.MultiheadAttention(E, H, **kw)
    ours.load_state_dict(ref.state_dict())
    note = f"{seed_note(case)} E={E} H={H} {kw} N={N} L={L} S={S} batched={batched} mask={kind} kpm={kpm} {fwd.keys()}"
    return ours, ref, (query, key, value), fwd, note


def run(module, inputs, fwd, dtype):
    """(out, weights) of module on inputs cast to dtype; torch's module gets no is_causal (1.13 lacks it)."""
    args = dict(fwd)
    if not isinstance(module, qt.MultiheadAttention):
        args.pop("is_causal", None)
    cast = lambda x: x if x is None or x.dtype == torch.bool else x.to(dtype)  # noqa: E731
    for name in ("attn_mask", "key_padding_mask"):
        if name in args:
            args[name] = cast(args[name])
    return module(*inputs, **args)


def close(got, ref, note):
    tol = 2e-5 * (1 + float(ref.abs().max())) if ref.numel() else 0
    err = float((got.double() - ref).abs().max()) if ref.numel() else 0
    assert err <= tol, f"{err:.3g} > {tol:.3g}; {note}"


@pytest.mark.parametrize("case", range(320))
def test_forward_matches_torch_float64(case):
    ours, ref, inputs, fwd, note = random_case(case)
    ref64 = copy.deepcopy(ref).double()
    out, w = run(ours, inputs, fwd, torch.float32)
    want, want_w = run(ref64, [x.double() for x in inputs], fwd, torch.float64)
    assert out.shape == want.shape and out.dtype == torch.float32, note
    close(out, want, note)
    if fwd["need_weights"]:
        assert w.shape == want_w.shape, note
        close(w, want_w, note)
    else:
        assert w is None, note


@pytest.mark.parametrize("case", range(1000, 1320))
def test_gradients_within_house_bound(case):
    ours, ref, inputs, fwd, note = random_case(case)
    fwd["need_weights"] = False
    ref64 = copy.deepcopy(ref).double()
    results = []
    for module, dtype in ((ours, torch.float32), (ref, torch.float32), (ref64, torch.float64)):
        xs = [x.detach().to(dtype).requires_grad_() for x in inputs]
        if inputs[0] is inputs[1]:
            xs = [xs[0]] * 3
        out, _ = run(module, xs, fwd, dtype)
        dout = torch.from_numpy(rng_for(case + 5).standard_normal(tuple(out.shape))).to(dtype)
        out.backward(dout)
        grads = {f"d{n}": x.grad for n, x in zip(("query", "key", "value"), xs)}
        grads.update({n: p.grad for n, p in module.named_parameters()})
        results.append(grads)
    got, pt, want = results
    assert got.keys() == want.keys(), note
    for name in want:
        if want[name] is None:
            continue
        err = float((got[name].double() - want[name]).abs().max())
        bound = 2 * float((pt[name].double() - want[name]).abs().max()) + 1e-5
        assert err <= bound, f"{name}: {err:.3g} > {bound:.3g}; {note}"


@pytest.mark.parametrize("kdim", [None, 6])
def test_state_dict_round_trip(kdim):
    torch.manual_seed(1)
    kw = dict(kdim=kdim, vdim=kdim, bias=True, add_bias_kv=True, batch_first=True)
    theirs = torch.nn.MultiheadAttention(16, 4, **kw)
    ours = qt.MultiheadAttention(16, 4, **kw)
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    back = torch.nn.MultiheadAttention(16, 4, **kw)
    back.load_state_dict(ours.state_dict())
    q = torch.randn(2, 7, 16)
    kv = torch.randn(2, 5, kdim or 16)
    a, wa = ours(q, kv, kv)
    b, wb = back(q, kv, kv)
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(wa, wb, atol=1e-6)
    assert set(ours.state_dict()) >= ({"q_proj_weight", "k_proj_weight"} if kdim else {"in_proj_weight"})


@pytest.mark.parametrize("batch_first", [False, True])
def test_float_key_padding_mask_is_added(batch_first):
    """As in PyTorch >= 2.0: equal to the same values given as a [N * H, L, S] float attn_mask."""
    torch.manual_seed(3)
    ref = torch.nn.MultiheadAttention(12, 3, batch_first=batch_first)
    ours = qt.MultiheadAttention(12, 3, batch_first=batch_first)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 12) if batch_first else torch.randn(5, 2, 12)
    kpm = torch.randn(2, 5)
    attn_mask = torch.tril(torch.randn(5, 5))
    out, w = ours(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask)
    merged = (attn_mask + kpm[:, None, None, :]).expand(2, 3, 5, 5).reshape(6, 5, 5)
    want, want_w = ref(x, x, x, attn_mask=merged)
    assert torch.allclose(out, want, atol=1e-5) and torch.allclose(w, want_w, atol=1e-6)


def test_need_weights_leaves_the_output_unchanged_and_fully_masked_rows_are_zero():
    torch.manual_seed(2)
    mha = qt.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    kpm = torch.tensor([[True] * 5, [False] * 4 + [True]])  # batch row 0: every key padded
    out, w = mha(x, x, x, key_padding_mask=kpm, average_attn_weights=False)
    out2, none = mha(x, x, x, key_padding_mask=kpm, need_weights=False)
    assert none is None and torch.equal(out, out2)
    assert torch.isfinite(out).all() and torch.equal(w[0], torch.zeros(2, 5, 5))
    assert torch.allclose(out[0], mha.out_proj.bias.expand(5, 8))  # attention output 0, then out_proj


def test_small_transformer_trains_like_pytorch():
    """Two copies of one transformer (torch's attention vs qkv's), same data: same loss curve."""
    def model():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        return torch.nn.ModuleDict(dict(emb=torch.nn.Embedding(10, 32), pos=torch.nn.Embedding(12, 32), layer=layer,
                                        head=torch.nn.Linear(32, 10)))

    def train(m, steps=200):
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        gen = torch.Generator().manual_seed(3)
        losses = []
        for _ in range(steps):
            x = torch.randint(0, 10, (16, 12), generator=gen)  # task: output the sequence reversed
            h = m["emb"](x) + m["pos"](torch.arange(12))
            logits = m["head"](m["layer"](h))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 10), x.flip(1).reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return torch.tensor(losses)

    theirs, ours = model(), model()
    ours["layer"].self_attn = qt.MultiheadAttention(32, 4, dropout=0.0, batch_first=True)
    ours["layer"].self_attn.load_state_dict(theirs["layer"].self_attn.state_dict())
    a, b = train(theirs), train(ours)
    assert b[-20:].mean() < 0.5 * b[:5].mean(), f"qkv model did not learn: {b[:5]} -> {b[-20:]}"
    diff = (a - b).abs() / a
    assert diff.max() < 0.02, f"loss curves differ by up to {float(diff.max()):.3g} (step {int(diff.argmax())})"


def mha():
    return qt.MultiheadAttention(8, 2)


x = torch.zeros(3, 2, 8)
ERRORS = [
    ("rank", lambda: mha()(x, x[0], x[0]), ValueError, "batched \\(rank 3\\) or unbatched"),
    ("embed", lambda: mha()(torch.zeros(3, 2, 6), x, x), ValueError, "embed_dim=8"),
    ("batch", lambda: mha()(x, torch.zeros(3, 1, 8), torch.zeros(3, 1, 8)), ValueError, "batch size"),
    ("attn_mask shape", lambda: mha()(x, x, x, attn_mask=torch.zeros(3, 4)), ValueError,
     "attn_mask: shape \\[3, 4\\] must be \\[3, 3\\] or \\[4, 3, 3\\]"),
    ("attn_mask dtype", lambda: mha()(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.int64)), TypeError,
     "attn_mask: dtype torch.int64"),
    ("kpm shape", lambda: mha()(x, x, x, key_padding_mask=torch.zeros(3, 2, dtype=torch.bool)), ValueError,
     "key_padding_mask: shape \\[3, 2\\] must be \\[2, 3\\]"),
    ("unbatched kpm shape", lambda: mha()(x[:, 0], x[:, 0], x[:, 0], key_padding_mask=torch.zeros(1, 3, dtype=torch.bool)),
     ValueError, "key_padding_mask: shape \\[1, 3\\] must be \\[3\\] \\(source length\\) for unbatched inputs"),
    ("kpm dtype", lambda: mha()(x, x, x, key_padding_mask=torch.zeros(2, 3, dtype=torch.int32)), TypeError,
     "key_padding_mask: dtype torch.int32"),
    ("is_causal", lambda: mha()(x, x, x, is_causal=True), ValueError, "is_causal=True is a hint"),
    ("is_causal int", lambda: mha()(x, x, x, attn_mask=torch.zeros(3, 3), is_causal=1), TypeError,
     "is_causal must be True or False, got 1"),
    # The is_causal hint skips reading attn_mask, not checking it (every such mask was taken).
    ("is_causal list mask", lambda: mha()(x, x, x, attn_mask=[1], is_causal=True), TypeError,
     "attn_mask must be a torch.Tensor, got list"),
    ("is_causal mask dtype", lambda: mha()(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.int64), is_causal=True),
     TypeError, "attn_mask: dtype torch.int64"),
    ("is_causal mask shape", lambda: mha()(x, x, x, attn_mask=torch.zeros(7, 3, 3), is_causal=True), ValueError,
     "attn_mask: shape \\[7, 3, 3\\] must be"),
    # key's and value's widths are named, not left to F.linear's "mat1 and mat2 shapes cannot be multiplied".
    ("key width", lambda: mha()(x, torch.zeros(3, 2, 9), x), ValueError, "key: last dim 9 must be kdim=8"),
    ("value width", lambda: qt.MultiheadAttention(8, 2, kdim=3, vdim=5)(x, torch.zeros(3, 2, 3), torch.zeros(3, 2, 6)),
     ValueError, "value: last dim 6 must be vdim=5"),
    ("dtype", lambda: mha()(x.half(), x.half(), x.half()), TypeError,
     r"query: dtype torch.float16 is not the module's \(torch.float32\).*module.to\(torch.float16\)"),
    ("int dtype", lambda: mha()(x.long(), x.long(), x.long()), TypeError, "query: dtype torch.int64 is not supported"),
    ("device", lambda: mha()(x, x.to("meta"), x), ValueError, "key is on device 'meta'"),
]


def raw_op(**change):
    """torch.ops.qkv.multihead_attention (what traced and scripted modules call) with mha()'s
    parameters, some changed."""
    m = mha()
    args = dict(num_heads=2, batch_first=False, add_zero_attn=False, dropout=0.0, training=False,
                in_proj_weight=m.in_proj_weight, in_proj_bias=m.in_proj_bias, q_proj_weight=None, k_proj_weight=None,
                v_proj_weight=None, bias_k=None, bias_v=None, out_proj_weight=m.out_proj.weight,
                out_proj_bias=m.out_proj.bias)
    args.update(change)
    return lambda: torch.ops.qkv.multihead_attention(x, x, x, None, False, None, True, False, *args.values())


def reassigned(**attrs):
    m = mha()
    for name, value in attrs.items():
        setattr(m, name, value)
    return lambda: m(x, x, x)


# Parameters that disagree with each other: given to the operator, or reassigned on a module. They
# were left to ZeroDivisionError, AttributeError or a matmul's "cannot be multiplied".
ERRORS += [
    ("num_heads 0", raw_op(num_heads=0), ValueError, "num_heads: 0 must be a positive divisor of embed_dim=8"),
    ("num_heads 3", reassigned(num_heads=3), ValueError, "num_heads: 3 must be a positive divisor of embed_dim=8"),
    ("no projection", raw_op(in_proj_weight=None), ValueError, "q_proj_weight: missing"),
    ("in_proj shape", raw_op(in_proj_weight=torch.zeros(16, 8)), ValueError,
     r"in_proj_weight: shape \[16, 8\] must be \[24, 8\]"),
    ("in_proj_bias shape", raw_op(in_proj_bias=torch.zeros(8)), ValueError,
     r"in_proj_bias: shape \[8\] must be \[24\]"),
    ("out_proj shape", raw_op(out_proj_weight=torch.zeros(8, 16)), ValueError,
     r"out_proj.weight: shape \[8, 16\] must be \[8, 8\]"),
    ("bias_k alone", raw_op(bias_k=torch.zeros(1, 1, 8)), ValueError, "bias_k and bias_v: give both"),
    ("bias_v shape", raw_op(bias_k=torch.zeros(1, 1, 8), bias_v=torch.zeros(1, 1, 3)), ValueError,
     r"bias_v: shape \[1, 1, 3\] must be \[1, 1, 8\]"),
    ("out_proj dtype", raw_op(out_proj_weight=torch.zeros(8, 8, dtype=torch.float64)), TypeError,
     r"out_proj.weight: dtype torch.float64 is not the module's \(torch.float32\)"),
]


@pytest.mark.parametrize("name,call,exc,message", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument(name, call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_eval_mode_allows_dropout_modules():
    m = qt.MultiheadAttention(8, 2, dropout=0.1).eval()
    out, _ = m(x, x, x)
    assert out.shape == x.shape


def test_bfloat16_module_matches_float32():
    """A bfloat16 module (bf16 kernel forward, widened backward) vs torch's float32 module, same weights."""
    torch.manual_seed(4)
    ours = qt.MultiheadAttention(16, 2, batch_first=True).to(torch.bfloat16)
    ref = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    ref.load_state_dict({k: v.float() for k, v in ours.state_dict().items()})
    x, mask = torch.randn(2, 9, 16).to(torch.bfloat16), torch.randn(9, 9).to(torch.bfloat16)
    out, w = ours(x, x, x, attn_mask=mask)
    out.float().sum().backward()
    assert out.dtype == w.dtype == torch.bfloat16 and ours.in_proj_weight.grad.dtype == torch.bfloat16
    want, want_w = ref(x.float(), x.float(), x.float(), attn_mask=mask.float())
    assert float((out.float() - want).abs().max()) <= 5e-2 * (1 + float(want.abs().max()))
    assert float((w.float() - want_w).abs().max()) <= 2e-2
    assert torch.isfinite(ours.in_proj_weight.grad).all()


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_float16_module_trains_within_half_precision_of_float64(seed):
    """module.to(torch.float16) runs forward and backward (projections in float32, rounded once) and
    stays within a few float16 roundings of torch's float64 module on the same weights and inputs."""
    print("seed", seed)
    torch.manual_seed(seed)
    ours = qt.MultiheadAttention(16, 2, batch_first=True, add_bias_kv=True).to(torch.float16)
    ref = torch.nn.MultiheadAttention(16, 2, batch_first=True, add_bias_kv=True).double()
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    x, mask = torch.randn(2, 9, 16).half().requires_grad_(), torch.randn(9, 9).half()
    out, w = ours(x, x, x, attn_mask=mask)
    out.float().square().sum().backward()
    xd = x.detach().double().requires_grad_()
    want, want_w = ref(xd, xd, xd, attn_mask=mask.double())
    want.square().sum().backward()
    assert out.dtype == w.dtype == x.grad.dtype == ours.in_proj_weight.grad.dtype == torch.float16
    ulp = 2.0 ** -11  # float16's relative rounding step
    for got, ref_t in ((out, want), (w, want_w), (x.grad, xd.grad), (ours.in_proj_weight.grad, ref.in_proj_weight.grad),
                       (ours.bias_k.grad, ref.bias_k.grad), (ours.out_proj.weight.grad, ref.out_proj.weight.grad)):
        err = float((got.double() - ref_t).abs().max())
        assert err <= 4 * ulp * (1 + float(ref_t.abs().max())), (err, float(ref_t.abs().max()))


def test_weights_under_huge_float_masks_are_exact():
    """A float32 module's weights for rows under a -1e9 mask (HuggingFace's style, or finfo.min) are
    the float64 softmax of the scores (they summed to 5-7 from the forward's float32 lse)."""
    torch.manual_seed(10)
    ours = qt.MultiheadAttention(16, 2, batch_first=True)
    ref = torch.nn.MultiheadAttention(16, 2, batch_first=True).double()
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    x = torch.randn(2, 5, 16)
    mask = torch.zeros(5, 5)
    mask[1] = -1e9
    mask[3] = torch.finfo(torch.float32).min
    pad = torch.zeros(2, 5)
    pad[1] = -1e9
    for average in (True, False):
        _, w = ours(x, x, x, attn_mask=mask, key_padding_mask=pad, average_attn_weights=average)
        _, want = ref(x.double(), x.double(), x.double(), attn_mask=mask.double(), key_padding_mask=pad.double(),
                      average_attn_weights=average)
        assert float((w.double() - want).abs().max()) <= 1e-5
        assert torch.allclose(w.sum(-1), torch.ones(()), atol=1e-5)


def test_a_loss_term_on_the_weights_raises_instead_of_being_dropped():
    """PyTorch's weights are differentiable; qkv's are computed without a gradient, so a loss term
    on them (an entropy penalty) raises in backward rather than silently doing nothing."""
    torch.manual_seed(11)
    m = qt.MultiheadAttention(8, 2)
    x = torch.randn(4, 2, 8)
    out, w = m(x, x, x)
    with pytest.raises(RuntimeError, match="a loss term uses the returned attention weights"):
        (out.sum() + 0.1 * (w * w.clamp_min(1e-9).log()).sum()).backward()
    out, w = m(x, x, x)
    (out.sum() + w.detach().sum()).backward()  # constants are fine, as is a loss on out alone
    assert m.in_proj_weight.grad is not None
    with torch.no_grad():
        assert not m(x, x, x)[1].requires_grad
    # A frozen module fed by a trainable encoder: only key (or a float mask) requires grad.
    m.requires_grad_(False)
    key = x.clone().requires_grad_()
    out, w = m(x, key, key)
    with pytest.raises(RuntimeError, match="a loss term uses the returned attention weights"):
        (out.sum() + (w ** 2).sum()).backward()


def test_training_example_runs():
    """examples/torch_train.py end to end at a tiny size (its figures are in docs/benchmarks.md)."""
    script = Path(__file__).resolve().parents[2] / "examples" / "torch_train.py"
    args = ["--seq", "32", "--steps", "2", "--warmup", "1", "--d-model", "32"]
    res = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=dict(os.environ),
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "speed-up" in res.stdout and "qkv    step" in res.stdout and "torch  step" in res.stdout, res.stdout


def test_float_attn_mask_gets_its_gradient():
    """A learnable float attn_mask (e.g. a relative-position bias) gets dL/dmask as in PyTorch."""
    torch.manual_seed(6)
    ref = torch.nn.MultiheadAttention(12, 3).double()
    ours = qt.MultiheadAttention(12, 3)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    x = torch.randn(7, 2, 12, dtype=torch.float64)
    grads = []
    for module, dtype in ((ours, torch.float32), (ref, torch.float64)):
        mask = torch.linspace(-1, 1, 6 * 49, dtype=dtype).reshape(6, 7, 7).requires_grad_()
        xs = x.to(dtype)
        out, _ = module(xs, xs, xs, attn_mask=mask, need_weights=False)
        out.pow(2).sum().backward()
        grads.append(mask.grad)
    assert grads[0].dtype == torch.float32
    assert float((grads[0].double() - grads[1]).abs().max()) <= 2e-5 * (1 + float(grads[1].abs().max()))
