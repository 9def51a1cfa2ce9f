"""qkv attention inside PyTorch models: scaled_dot_product_attention and MultiheadAttention with
autograd, computed by qkv's fused CPU kernels (float64 by its reference kernel).

    import torch, qkv.torch
    out = qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # like F.sdpa
    attn = qkv.torch.MultiheadAttention(256, 8, batch_first=True)           # like nn.MultiheadAttention

`import qkv` never imports torch; `import qkv.torch` does (and needs it). Both functions are also
PyTorch operators (qkv::scaled_dot_product_attention, qkv::multihead_attention), so models using
them trace and script; ring_attention runs sequence-parallel attention over a torch.distributed
process group (docs/torch.md).

Memory: CPU tensors of float32, bfloat16 or float64 are read in place through numpy views of
their storage (any strides, broadcast views included), and results are wrapped without a copy.
Copies happen only (a) when inputs of rank > 4 have several batch dims that cannot be flattened
into one by a view (torch.reshape copies then), (b) for the bfloat16 backward, which widens q, k,
v and dout to float32, and for float16, whose q, k, v (and dout) are widened to float32, exactly,
for the fp32 kernels (results rounded to float16 once, at the end), (c) for bfloat16, float16 or
float64 masks (qkv reads float32 masks), (d) for a MultiheadAttention that gets a boolean and a
float mask of the same kind to merge, (e) for views with the negative bit set (x.conj().imag)
and (f) for enable_gqa with fewer value heads than key heads (or the other way round), which
repeats both to the query's heads.

Errors: TypeError for a wrong type or dtype, ValueError for a wrong value or shape, as classes
that are also RuntimeError (PyTorch's SDPA raises RuntimeError) and, from MultiheadAttention,
AssertionError (what its shape checks raise in PyTorch): code written against PyTorch catches them.

Differences from PyTorch, all deliberate:
  - a query row with no allowed key gives output 0 (and zero gradients), as PyTorch >= 2.5's
    scaled_dot_product_attention does (earlier versions, and nn.MultiheadAttention's weights, NaN);
  - second-order gradients (create_graph=True, then differentiating the gradients) raise
    RuntimeError when used, instead of being silently 0, on every front end (the function,
    MultiheadAttention, varlen_attention, ring_attention);
  - return_lse's lse has no gradient: a loss term on it raises RuntimeError in backward (use
    lse.detach() for a constant), instead of being silently dropped;
  - dropout runs in qkv's kernels with qkv's own keep-mask (Philox, keyed by a seed drawn from
    torch's default generator, so torch.manual_seed makes runs reproducible; the masks differ from
    PyTorch's bernoulli ones); dropout_p = 1 raises (it must be below 1);
  - float64 inputs run qkv's float64 reference, but a float mask is rounded to float32 first
    (finite values saturate at float32's largest: torch.finfo(torch.float64).min stays a very
    negative finite bias, as in PyTorch, not -inf);
  - a float mask with no key dim of its own (a scalar, or size 1 in the last dim) gets a gradient
    of exactly 0, which it is (softmax ignores a constant added to a row), where PyTorch's
    composite returns the rounding noise of summing dS along the keys.
"""

import math
import re

import numpy as np
import torch

from . import _qkv
from .attention import _constant_along_keys, dropout_mask
from ._torch_checks import (_autocast, _check_mask, _check_qkv, _dropout_seed, _first_order_only, _raising,
                            _refuse_lse_gradient, _scalar, _vector_arg)

__all__ = ["scaled_dot_product_attention", "MultiheadAttention", "SdpaValueError", "SdpaTypeError", "MhaValueError",
           "MhaTypeError", "ring_attention", "shard", "unshard", "shard_ranges"]

_FLT_MAX = float(np.finfo(np.float32).max)


class SdpaValueError(ValueError, RuntimeError):
    """A bad value or shape given to scaled_dot_product_attention (PyTorch raises RuntimeError)."""


class SdpaTypeError(TypeError, RuntimeError):
    """A bad type or dtype given to scaled_dot_product_attention (PyTorch raises RuntimeError)."""


class MhaValueError(ValueError, RuntimeError, AssertionError):
    """A bad value or shape given to MultiheadAttention (PyTorch asserts, or raises RuntimeError)."""


class MhaTypeError(TypeError, RuntimeError, AssertionError):
    """A bad type or dtype given to MultiheadAttention (PyTorch asserts, or raises RuntimeError)."""


def _numpy(t):
    """A numpy view of CPU tensor t's memory (no copy unless its negative bit is set); bfloat16 as
    its uint16 bit patterns."""
    t = t.detach().resolve_neg()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _broadcast(shapes, what):
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        raise ValueError(f"{what}: leading dims {[list(s) for s in shapes]} do not broadcast") from None


class _Layout:
    """How the caller's [..., L, E] tensors map to qkv's [B, H, L, E]: `lead` is the output's
    leading shape; heads are dim -3 for rank >= 4 (and for rank 3 with enable_gqa), else 1."""

    def __init__(self, q, k, v, enable_gqa):
        if enable_gqa:
            if min(q.dim(), k.dim(), v.dim()) < 3:
                raise ValueError("enable_gqa=True needs query, key and value of rank >= 3 (heads at dim -3)")
            hq, hk = q.size(-3), k.size(-3)
            if v.size(-3) != hk or hk == 0 or hq % hk != 0:
                raise ValueError(f"enable_gqa: query heads {hq} must be a multiple of key heads {hk} and of value "
                                 f"heads {v.size(-3)}")
            self.batch = _broadcast([q.shape[:-3], k.shape[:-3], v.shape[:-3]], "query, key, value")
            self.lead = self.batch + (hq,)
            self.kv_lead = self.batch + (hk,)
            self.squeeze_heads = False
        else:
            full = _broadcast([q.shape[:-2], k.shape[:-2], v.shape[:-2]], "query, key, value")
            self.lead = self.kv_lead = full
            self.squeeze_heads = len(full) < 2
            self.batch = full if self.squeeze_heads else full[:-1]
        self.B = math.prod(self.batch)

    def to4(self, t, lead):
        """t broadcast to lead + t.shape[-2:], as [B, H, rows, cols] (a view unless batch dims must merge)."""
        t = t.expand(*lead, *t.shape[-2:])
        if self.squeeze_heads:
            t = t.unsqueeze(-3)
        if len(self.batch) == 0:
            return t.unsqueeze(0)
        return t if len(self.batch) == 1 else t.reshape(self.B, *t.shape[-3:])

    def back(self, t4, last):
        """qkv's [B, H, L, last] result in the caller's shape lead + (L, last)."""
        return t4.reshape(*self.lead, t4.size(2), *last)

    def views(self, q, k, v, bias, keep):
        """q, k, v and the masks as qkv's [B, H, rows, cols] (to4)."""
        L, S = q.size(-2), k.size(-2)
        masks = (None if m is None else self.to4(m.expand(*self.lead, L, S), self.lead) for m in (bias, keep))
        return (self.to4(q, self.lead), self.to4(k, self.kv_lead), self.to4(v, self.kv_lead), *masks)

    def source_index(self, index4, shape):
        """The index, in a caller's mask of `shape` that views() broadcast to lead + (L, S), of element
        index4 of its [B, H, L, S] view."""
        b, h, i, j = index4
        batch = []
        for n in reversed(self.batch):
            b, r = divmod(b, n)
            batch.insert(0, r)
        full = (*batch, *(() if self.squeeze_heads else (h,)), i, j)
        return tuple(0 if n == 1 else full[len(full) - len(shape) + d] for d, n in enumerate(shape))

    def gradient(self, g4, t, lead):
        """The gradient of caller tensor t from that of its to4(t, lead) view, summed over the dims t
        was broadcast along in g4's dtype: float32 for 16-bit t, rounded to t's dtype once, after."""
        return g4.reshape(*lead, *g4.shape[2:]).sum_to_size(t.shape).to(t.dtype)


def _mask_numpy(mask, dtype):
    """qkv's view of a [B, H, L, S] mask: bool as keep_mask, float as float32 bias (copied if not float32)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return _numpy(mask)
    if mask.dtype == torch.float64:
        # Finite values saturate (float64's finfo.min, HuggingFace's mask value, is not -inf).
        m = mask.detach()
        mask = torch.where(torch.isfinite(m), m.clamp(-_FLT_MAX, _FLT_MAX), m).float()
    elif mask.dtype != torch.float32:
        mask = mask.detach().float()  # bfloat16 and float16 widen exactly
    return _numpy(mask)


class _AttentionFunction(torch.autograd.Function):
    """out, lse = attention(q, k, v) on the caller's tensors, which `layout` (a _Layout) maps to
    qkv's [B, H, L, E]; out and lse come back in that shape. Gradients for q, k, v and the float mask."""

    @staticmethod
    def forward(ctx, q, k, v, bias, keep, layout, extras, scale, num_threads):
        # The caller's tensors come in (not their [B, H, L, E] views) so that the backward sums a
        # broadcast input's gradient before rounding it to a 16-bit dtype, not autograd after.
        inputs = (q, k, v, bias, keep)
        q, k, v, bias, keep = layout.views(*inputs)
        mask = dict(extras, keep_mask=_mask_numpy(keep, q.dtype), bias=_mask_numpy(bias, q.dtype))
        # float16 has no kernel of its own: the fp32 kernel on the exactly widened inputs, so out and
        # lse are the fp32 forward's and the backward can reuse them.
        widen = (lambda t: _numpy(t.float())) if q.dtype == torch.float16 else _numpy
        out, lse = _qkv.scaled_dot_product_attention(widen(q), widen(k), widen(v), mask, scale, True, True, "auto",
                                                     num_threads, "auto", False)
        # The backward keeps the float64 lse (P recomputed to fp32 accuracy at large scores); the
        # caller gets it in the dtype of the scores (float32 for bfloat16 and float16 inputs).
        out, lse64 = torch.from_numpy(out), torch.from_numpy(lse)
        lse = lse64 if q.dtype == torch.float64 else lse64.float()
        # Only the outputs a loss uses get a gradient (None for the other, not zeros to read).
        ctx.set_materialize_grads(False)
        ctx.layout, ctx.extras, ctx.scale, ctx.num_threads = layout, extras, scale, num_threads
        ctx.save_for_backward(*inputs, out, lse64)
        if q.dtype in (torch.bfloat16, torch.float16):
            out = out.to(q.dtype)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        with torch.no_grad():
            grads = _AttentionFunction._backward(ctx, dout, dlse)
        return _first_order_only(grads, (*ctx.saved_tensors[:4], dout, dlse), "scaled_dot_product_attention")

    @staticmethod
    def _backward(ctx, dout, dlse):
        *inputs, out, lse = ctx.saved_tensors
        layout = ctx.layout
        q, k, v, bias, keep = layout.views(*inputs)
        _refuse_lse_gradient(dlse, "scaled_dot_product_attention")
        if dout is None:  # only lse was used, and with a zero gradient
            return (None,) * 9
        want_dbias = ctx.needs_input_grad[3]
        zero_dbias = want_dbias and _constant_along_keys(inputs[3].shape)
        mask = dict(ctx.extras, keep_mask=_mask_numpy(keep, q.dtype), bias=_mask_numpy(bias, q.dtype))
        dtype = q.dtype
        if dtype in (torch.bfloat16, torch.float16):  # no 16-bit backward kernel: the fp32 one
            q, k, v, dout = (t.float() for t in (q, k, v, dout))
        # out and lse are the fp32 forward's for float32 and float16 (the fp32 kernel ran on these
        # widened inputs; out is saved unrounded); bf16's forward is its own kernel and float64's
        # the reference, so their backward reruns the forward it needs.
        reuse = dtype in (torch.float32, torch.float16)
        out_np, lse_np = (out.numpy(), lse.numpy()) if reuse else (None, None)
        grads = _qkv.attention_backward(_numpy(q), _numpy(k), _numpy(v), _numpy(dout), out_np, lse_np, mask,
                                        ctx.scale, want_dbias and not zero_dbias, "auto", ctx.num_threads, "auto",
                                        False)
        leads = (layout.lead, layout.kv_lead, layout.kv_lead, layout.lead)
        grads = [layout.gradient(torch.from_numpy(g), t, lead) for g, t, lead in zip(grads, inputs, leads)]
        if zero_dbias:
            grads.append(torch.zeros_like(inputs[3]))
        return (*grads[:3], grads[3] if want_dbias else None, None, None, None, None, None)


def _extras(is_causal, causal_align, window, alibi_slopes, softcap, key_lengths, query_lengths, dropout_p=0.0):
    """The options dict of one call; with dropout, the seed of its keep-mask is drawn here from torch's
    default generator (only then, so runs without dropout leave the generator alone), and the
    backward reuses this dict, so it regenerates the same mask."""
    extras = dict(causal=_qkv._flag_arg(is_causal, "is_causal"), causal_align=causal_align, window=window,
                  alibi_slopes=_vector_arg(alibi_slopes, "alibi_slopes", False), softcap=softcap,
                  key_lengths=_vector_arg(key_lengths, "key_lengths", True),
                  query_lengths=_vector_arg(query_lengths, "query_lengths", True))
    dropout_p = _qkv._dropout_p_arg(_scalar(dropout_p))
    if dropout_p > 0.0:
        extras.update(dropout_p=dropout_p, dropout_seed=_dropout_seed())
    return extras


def _dropped(w, extras):
    """Softmax weights [B, H, L, S] as the call's dropout left them (what PyTorch's MHA returns)."""
    p = extras.get("dropout_p", 0.0)
    if p == 0.0:
        return w
    keep = torch.from_numpy(dropout_mask(tuple(w.shape), p, extras["dropout_seed"]))
    return w * keep.to(w.dtype) / (1.0 - p)


_MASK_VALUE = re.compile(r"bias contains (NaN|\+inf) at index \(([0-9, ]*)\)")


def _attention(q, k, v, layout, keep, bias, extras, scale, num_threads, source=None):
    """Runs the autograd function on the caller's tensors; returns (out, lse) in the caller's shape.
    source(index) names the caller's float mask holding element `index` of the [B, H, L, S] bias
    and gives its index there: (name, index)."""
    # Any real number (numpy's scalars and 0-d tensors too, as PyTorch takes them), as a float.
    if scale is not None:
        scale = _qkv._scale_arg(_scalar(scale))
    if num_threads is None:
        num_threads = torch.get_num_threads()
    try:
        out4, lse4 = _AttentionFunction.apply(q, k, v, bias, keep, layout, extras, scale, num_threads)
    except ValueError as e:
        # qkv's rule for a float mask (NaN and +inf refused) names its own bias argument and an
        # index of the [B, H, L, S] view; the caller passed another tensor, of another shape.
        bad = _MASK_VALUE.fullmatch(str(e))
        if bad is None or source is None:
            raise
        name, index = source(tuple(int(i) for i in bad.group(2).split(",")))
        raise ValueError(f"{name} contains {bad.group(1)} at index {index}") from None
    return layout.back(out4, (v.size(-1),)), layout.back(lse4, ())


def _sdpa_layout(query, key, value, enable_gqa):
    """scaled_dot_product_attention's checked q, k, v: (key, value, _Layout)."""
    _check_qkv(query, key, value)
    # Flags are True or False, as PyTorch's own argument parser requires of enable_gqa.
    enable_gqa = _qkv._flag_arg(enable_gqa, "enable_gqa")
    if enable_gqa and min(query.dim(), key.dim(), value.dim()) >= 3:
        # PyTorch lets key and value have different head counts that both divide the query's:
        # qkv's kernels take one count, so both are repeated to the query's heads (a copy).
        hq, hk, hv = query.size(-3), key.size(-3), value.size(-3)
        if hk != hv and hk > 0 and hv > 0 and hq % hk == 0 and hq % hv == 0:
            key, value = key.repeat_interleave(hq // hk, dim=-3), value.repeat_interleave(hq // hv, dim=-3)
    return key, value, _Layout(query, key, value, enable_gqa)


@_raising(SdpaValueError, SdpaTypeError)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, window=None, alibi_slopes=None, softcap=None, key_lengths=None,
                                 query_lengths=None, causal_align="top_left", return_lse=False, num_threads=None):
    """torch.nn.functional.scaled_dot_product_attention computed by qkv, with autograd.

    Same semantics as PyTorch's (current documentation): query [..., L, E], key [..., S, E], value
    [..., S, Ev] with broadcastable leading dims; attn_mask broadcastable to [..., L, S], bool
    (True = takes part) or float (added to the scaled scores; its gradient is computed when it
    requires grad); is_causal = top-left lower-triangular mask and excludes attn_mask; scale
    defaults to 1/sqrt(E); enable_gqa lets key/value have fewer heads (dim -3) than query, query
    head h using key head h // (Hq / Hkv). Returns [..., L, Ev] in query's dtype.

    Inputs: CPU tensors of one dtype, float32 (qkv's fused kernel), bfloat16 (qkv's bf16 kernel,
    fp32 accumulation; the backward widens to float32, a copy), float16 (widened to float32, a
    copy, for the fp32 kernel forward and backward; results rounded to float16 once) or float64
    (qkv's float64 reference). Inside torch.autocast("cpu"), float32 and float16 inputs are cast to
    autocast's dtype first, as PyTorch's function is. Read in place, any strides (see the module docstring for the few
    copies).

    qkv extras (keyword-only; heads = dim -3 for rank >= 4 or rank 3 with enable_gqa, else 1;
    batch rows = the other leading dims flattened):
      window=(left, right): query i sees keys diag(i) - left <= j <= diag(i) + right (None = unbounded).
      alibi_slopes: one float per query head (a sequence, or a 1-D floating tensor as FlashAttention
          passes it; no gradient: one that requires grad is refused), adds -slope * |j - diag(i)|.
      softcap: c > 0 turns scores s into c * tanh(s / c) before the mask is added.
      key_lengths / query_lengths: an int or one int per batch row (a sequence or a 1-D integer
          tensor); keys j >= key_lengths[b] are masked, query rows i >= query_lengths[b] give 0.
      causal_align: "top_left" (PyTorch's) or "bottom_right" (diag(i) = i + S_b - L_b).
      return_lse: also return lse [..., L] (float32 for 16-bit inputs), the log-sum-exp of each
          row's scores (empty with no heads; with a value dim of 0, out is empty and lse is not).
          qkv computes no gradient for lse: a backward that reaches it with a nonzero gradient (a
          loss term on lse) raises RuntimeError naming lse; lse.detach() is a constant.
      num_threads: threads for this call; default torch.get_num_threads(). Results are bitwise
          identical for any thread count.

    A query row with no allowed key returns 0 (as PyTorch >= 2.5). Raises SdpaTypeError (a
    TypeError and RuntimeError) for a wrong type or dtype and SdpaValueError (a ValueError and
    RuntimeError) for a wrong device, shape, or dropout_p outside [0, 1), naming the argument (a
    float attn_mask holding NaN or +inf: "attn_mask contains NaN at index (1, 2)", the index in
    attn_mask itself).

    dropout_p > 0 drops each softmax weight with that probability inside qkv's kernels (forward and
    backward regenerate one keep-mask; qkv.dropout_mask shows it), keyed by a seed drawn from
    torch's default generator: torch.manual_seed(s) replays a run. Pass dropout_p=0.0 at eval, as
    with PyTorch's function.

    torch.jit.trace records a call as one qkv::scaled_dot_product_attention node and torch.jit.script
    compiles it to that operator (docs/torch.md); return_lse=True is traced as the operator's
    overload qkv::scaled_dot_product_attention.lse.
    """
    query, key, value = _autocast(query, key, value)
    if torch.jit.is_tracing():
        return _ops.traced_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window,
                                alibi_slopes, softcap, key_lengths, query_lengths, causal_align, return_lse,
                                num_threads)
    extras = _extras(is_causal, causal_align, window, alibi_slopes, softcap, key_lengths, query_lengths, dropout_p)
    key, value, layout = _sdpa_layout(query, key, value, enable_gqa)
    return_lse = _qkv._flag_arg(return_lse, "return_lse")
    keep = bias = None
    if attn_mask is not None:
        if is_causal:
            raise ValueError("attn_mask must be None when is_causal=True (as in PyTorch); fold the causal mask into "
                             "attn_mask instead")
        _check_mask(attn_mask, "attn_mask", layout.lead + (query.size(-2), key.size(-2)))
        keep, bias = (attn_mask, None) if attn_mask.dtype == torch.bool else (None, attn_mask)
    rows = math.prod(layout.lead) * query.size(-2)
    if rows * value.size(-1) == 0 and not (return_lse and rows):
        # An empty result (no heads, value dim 0, ...) is empty, as in PyTorch; qkv's kernels refuse
        # zero heads and Dv = 0. The zero term keeps autograd's view: zero gradients for the inputs.
        out = query.new_zeros(*layout.lead, query.size(-2), value.size(-1))
        inputs = [t for t in (query, key, value, bias) if t is not None and t.requires_grad]
        out = out + sum(t.sum() for t in inputs) * 0 if inputs else out
        lse_dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
        return (out, query.new_zeros(*layout.lead, query.size(-2), dtype=lse_dtype)) if return_lse else out
    source = None
    if bias is not None:
        source = lambda index: ("attn_mask", layout.source_index(index, bias.shape))  # noqa: E731
    if value.size(-1) == 0:
        # Value dim 0 with return_lse: out is empty, but lse (which v does not enter) is not; qkv's
        # kernels refuse Dv = 0, so they run on one zero value column, dropped from out after.
        one = value.new_zeros(()).expand(*value.shape[:-1], 1)
        out, lse = _attention(query, key, one, layout, keep, bias, extras, scale, num_threads, source)
        out = out[..., :0]
        return (out + value.sum() * 0 if value.requires_grad else out), lse
    out, lse = _attention(query, key, value, layout, keep, bias, extras, scale, num_threads, source)
    return (out, lse) if return_lse else out


from ._torch_mha import MultiheadAttention  # noqa: E402,F401
from ._torch_varlen import varlen_attention  # noqa: E402,F401
from . import _torch_ops as _ops  # noqa: E402 (registers the qkv:: operators, which call the functions above)
from ._torch_ring import ring_attention, shard, shard_ranges, unshard  # noqa: E402,F401
