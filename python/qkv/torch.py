"""qkv attention inside PyTorch models: scaled_dot_product_attention and MultiheadAttention with
autograd, computed by qkv's fused CPU kernels (float64 by its reference kernel).

    import torch, qkv.torch
    out = qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # like F.sdpa
    attn = qkv.torch.MultiheadAttention(256, 8, batch_first=True)           # like nn.MultiheadAttention

`import qkv` never imports torch; `import qkv.torch` does (and needs it).

Memory: CPU tensors of float32, bfloat16 or float64 are read in place through numpy views of
their storage (any strides, broadcast views included), and results are wrapped without a copy.
Copies happen only (a) when inputs of rank > 4 have several batch dims that cannot be flattened
into one by a view (torch.reshape copies then), (b) for the bfloat16 backward, which widens q, k,
v and dout to float32, (c) for bfloat16 or float64 masks (qkv reads float32 masks) and (d) for a
MultiheadAttention that gets a boolean and a float mask of the same kind to merge.

Differences from PyTorch, all deliberate:
  - a query row with no allowed key gives output 0 (and zero gradients) where PyTorch gives NaN;
  - dropout is not implemented: dropout_p > 0 (or a training MultiheadAttention with dropout > 0)
    raises ValueError instead of silently not dropping;
  - float64 inputs run qkv's float64 reference, but a float mask is rounded to float32 first.
"""

import math
import numbers

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import _qkv

__all__ = ["scaled_dot_product_attention", "MultiheadAttention"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
_TORCH_SDPA = "torch.nn.functional.scaled_dot_product_attention (PyTorch >= 2.0)"


def _check_tensor(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on device '{t.device}': qkv.torch computes on CPU tensors only; pass "
                         f"{name}.cpu(), or use {_TORCH_SDPA} for {t.device.type} tensors")
    if t.layout != torch.strided:
        raise TypeError(f"{name}: layout {t.layout} is not supported; pass a dense tensor ({name}.to_dense())")


def _check_inputs(q, k, v):
    """Type, device, dtype and rank >= 2 of query, key and value."""
    for t, name in ((q, "query"), (k, "key"), (v, "value")):
        _check_tensor(t, name)
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype} is not supported by qkv.torch; use float32, bfloat16 or "
                            f"float64 ({name}.float()), or {_TORCH_SDPA}")
        if t.dim() < 2:
            raise ValueError(f"{name}: expected shape [..., seq, dim] (rank >= 2), got {list(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"query, key and value must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}")


def _check_qkv(q, k, v):
    _check_inputs(q, k, v)
    if k.size(-1) != q.size(-1):
        raise ValueError(f"query {list(q.shape)} and key {list(k.shape)} must have the same last dim E")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"key {list(k.shape)} and value {list(v.shape)} must have the same sequence length S")


def _numpy(t):
    """A numpy view of CPU tensor t's memory (no copy); bfloat16 as its uint16 bit patterns."""
    t = t.detach()
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
                raise ValueError(f"enable_gqa: query heads {hq} must be a multiple of key heads {hk} and value heads "
                                 f"{v.size(-3)}, which must be equal")
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


def _mask_numpy(mask, dtype):
    """qkv's view of a [B, H, L, S] mask: bool as keep_mask, float as float32 bias (copied if not float32)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return _numpy(mask)
    if mask.dtype != torch.float32:
        mask = mask.detach().float()
    return _numpy(mask)


class _AttentionFunction(torch.autograd.Function):
    """out, lse = attention(q, k, v) on [B, H, L, E] tensors; gradients for q, k, v and the float mask."""

    @staticmethod
    def forward(ctx, q, k, v, bias, keep, extras, scale, num_threads):
        mask = dict(extras, keep_mask=_mask_numpy(keep, q.dtype), bias=_mask_numpy(bias, q.dtype))
        out, lse = _qkv.scaled_dot_product_attention(_numpy(q), _numpy(k), _numpy(v), mask, scale, True, True, "auto",
                                                     num_threads, "auto", False)
        # The backward keeps the float64 lse (P recomputed to fp32 accuracy at large scores); the
        # caller gets it in the dtype of the scores (float32 for bfloat16 inputs).
        out, lse64 = torch.from_numpy(out), torch.from_numpy(lse)
        lse = lse64 if q.dtype == torch.float64 else lse64.float()
        ctx.mark_non_differentiable(lse)
        ctx.extras, ctx.scale, ctx.num_threads = extras, scale, num_threads
        ctx.save_for_backward(q, k, v, bias, keep, out, lse64)
        if q.dtype == torch.bfloat16:
            out = out.to(torch.bfloat16)
        return out, lse

    @staticmethod
    @once_differentiable  # qkv's backward is not itself differentiable: double backward raises
    def backward(ctx, dout, _dlse):
        q, k, v, bias, keep, out, lse = ctx.saved_tensors
        want_dbias = ctx.needs_input_grad[3]
        mask = dict(ctx.extras, keep_mask=_mask_numpy(keep, q.dtype), bias=_mask_numpy(bias, q.dtype))
        dtype = q.dtype
        if dtype == torch.bfloat16:
            # No bf16 backward kernel: widen to float32 and let the fp32 backward rerun its own forward
            # (the bf16 forward's out and lse are not the fp32 forward's).
            q, k, v, dout = (t.float() for t in (q, k, v, dout))
            out_np = lse_np = None
        elif dtype == torch.float32:
            out_np, lse_np = out.numpy(), lse.numpy()
        else:
            out_np = lse_np = None
        grads = _qkv.attention_backward(_numpy(q), _numpy(k), _numpy(v), _numpy(dout), out_np, lse_np, mask,
                                        ctx.scale, want_dbias, "auto", ctx.num_threads, "auto", False)
        dq, dk, dv = (torch.from_numpy(g).to(dtype) for g in grads[:3])
        dbias = torch.from_numpy(grads[3]).to(bias.dtype) if want_dbias else None
        return dq, dk, dv, dbias, None, None, None, None


def _extras(is_causal, causal_align, window, alibi_slopes, softcap, key_lengths, query_lengths):
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
    return dict(causal=is_causal, causal_align=causal_align, window=window, alibi_slopes=alibi_slopes,
                softcap=softcap, key_lengths=key_lengths, query_lengths=query_lengths)


def _check_mask(mask, name, scores_shape):
    _check_tensor(mask, name)
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise TypeError(f"{name}: dtype {mask.dtype} is not supported; pass a bool mask (True = take part) or a "
                        f"float mask added to the scores")
    try:
        torch.broadcast_shapes(mask.shape, scores_shape)
        ok = len(mask.shape) <= len(scores_shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name}: shape {list(mask.shape)} does not broadcast to the scores' shape "
                         f"{list(scores_shape)}")


def _attention(q, k, v, layout, keep, bias, extras, scale, num_threads):
    """Runs the autograd function on the caller's tensors; returns (out, lse) in the caller's shape."""
    # Any real number (numpy's scalars too, as PyTorch takes them), as a Python float.
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):  # numpy's bool is not Real
            raise TypeError(f"scale must be a number or None, got {scale!r}")
        scale = float(scale)
    if num_threads is None:
        num_threads = torch.get_num_threads()
    L, S = q.size(-2), k.size(-2)
    q4, k4, v4 = layout.to4(q, layout.lead), layout.to4(k, layout.kv_lead), layout.to4(v, layout.kv_lead)
    keep4 = None if keep is None else layout.to4(keep.expand(*layout.lead, L, S), layout.lead)
    bias4 = None if bias is None else layout.to4(bias.expand(*layout.lead, L, S), layout.lead)
    out4, lse4 = _AttentionFunction.apply(q4, k4, v4, bias4, keep4, extras, scale, num_threads)
    return layout.back(out4, (v.size(-1),)), layout.back(lse4, ())


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
    fp32 accumulation; the backward widens to float32, a copy) or float64 (qkv's float64
    reference). Read in place, any strides (see the module docstring for the few copies).

    qkv extras (keyword-only; heads = dim -3 for rank >= 4 or rank 3 with enable_gqa, else 1;
    batch rows = the other leading dims flattened):
      window=(left, right): query i sees keys diag(i) - left <= j <= diag(i) + right (None = unbounded).
      alibi_slopes: one float per query head, adds -slope * |j - diag(i)|.
      softcap: c > 0 turns scores s into c * tanh(s / c) before the mask is added.
      key_lengths / query_lengths: an int or one int per batch row; keys j >= key_lengths[b] are
          masked, query rows i >= query_lengths[b] give 0.
      causal_align: "top_left" (PyTorch's) or "bottom_right" (diag(i) = i + S_b - L_b).
      return_lse: also return lse [..., L] (float32 for bfloat16 inputs), the log-sum-exp of each
          row's scores; it is not differentiable (backward through it raises).
      num_threads: threads for this call; default torch.get_num_threads(). Results are bitwise
          identical for any thread count.

    A query row with no allowed key returns 0 (PyTorch returns NaN). Raises TypeError for a wrong
    type or dtype and ValueError for a wrong device, shape, or dropout_p > 0, naming the argument.
    """
    _check_qkv(query, key, value)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be a number in [0, 1], got {dropout_p!r}")
    if dropout_p > 0.0:
        raise ValueError(f"dropout_p={dropout_p}: qkv has no attention dropout; pass dropout_p=0.0 (e.g. "
                         f"dropout_p=p if self.training else 0.0 and use qkv only at eval), or use {_TORCH_SDPA}")
    extras = _extras(is_causal, causal_align, window, alibi_slopes, softcap, key_lengths, query_lengths)
    # Flags are True or False, as PyTorch's own argument parser requires of enable_gqa.
    layout = _Layout(query, key, value, _qkv._flag_arg(enable_gqa, "enable_gqa"))
    return_lse = _qkv._flag_arg(return_lse, "return_lse")
    keep = bias = None
    if attn_mask is not None:
        if is_causal:
            raise ValueError("attn_mask must be None when is_causal=True (as in PyTorch); fold the causal mask into "
                             "attn_mask instead")
        _check_mask(attn_mask, "attn_mask", layout.lead + (query.size(-2), key.size(-2)))
        keep, bias = (attn_mask, None) if attn_mask.dtype == torch.bool else (None, attn_mask)
    out, lse = _attention(query, key, value, layout, keep, bias, extras, scale, num_threads)
    return (out, lse) if return_lse else out


def _merge_masks(masks):
    """The [N, H|1, L, S] masks as one bool keep mask and one float bias (either may be None)."""
    keep = bias = None
    for m in masks:
        if m is None:
            continue
        if m.dtype == torch.bool:
            keep = ~m if keep is None else keep & ~m
        else:
            bias = m if bias is None else bias + m
    return keep, bias


def _mha_mask(m, name):
    if m.dtype != torch.bool and not m.dtype.is_floating_point:
        raise TypeError(f"{name}: dtype {m.dtype} is not supported; pass a bool mask (True = not allowed) or a float "
                        "mask added to the scores")
    return m


class MultiheadAttention(torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention whose attention runs in qkv (same constructor, parameters,
    state_dict keys and forward signature; load a torch.nn.MultiheadAttention's state_dict as is).

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
            average_attn_weights=True, is_causal=False) -> (attn_output, attn_weights or None)
    with PyTorch's meaning: masks True = NOT allowed (bool) or added (float); attn_mask [L, S] or
    [N * num_heads, L, S]; is_causal is a hint that attn_mask is the causal mask (attn_mask is then
    required, as in PyTorch, and qkv applies its causal mask instead of reading attn_mask).

    need_weights=True returns the exact softmax weights (recomputed by qkv's attention_weights
    from the forward's log-sum-exp, in float32; float64 modules use the float64 composite), which
    are not differentiable; need_weights=False (use it when training) skips that work entirely.
    Dropout: a module with dropout > 0 raises ValueError in training mode (eval mode is fine).
    Fully masked rows give zeros where PyTorch gives NaN.

    Note: torch.nn.TransformerEncoderLayer's inference fast path (eval mode under no_grad) calls
    torch._transformer_encoder_layer_fwd with the layer's weights and never calls self_attn, so an
    instance of this class swapped into it runs only in training or with grad enabled.
    """

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if self.training and self.dropout > 0.0:
            raise ValueError(f"MultiheadAttention(dropout={self.dropout}) in training mode: qkv has no attention "
                             "dropout; construct it with dropout=0.0, call .eval(), or use torch.nn.MultiheadAttention")
        _check_inputs(query, key, value)
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(f"query, key and value must all be batched (rank 3) or unbatched (rank 2), got shapes "
                             f"{list(query.shape)}, {list(key.shape)}, {list(value.shape)}")
        batched = query.dim() == 3
        bd = 0 if self.batch_first else 1  # batch dim, and 1 - bd is the sequence dim
        if not batched:
            query, key, value = (t.unsqueeze(bd) for t in (query, key, value))
            if key_padding_mask is not None:
                _check_tensor(key_padding_mask, "key_padding_mask")
                key_padding_mask = key_padding_mask.unsqueeze(0)
        sd = 1 - bd
        N, L, S = query.size(bd), query.size(sd), key.size(sd)
        if query.size(-1) != self.embed_dim:
            raise ValueError(f"query: last dim {query.size(-1)} must be embed_dim={self.embed_dim}")
        if key.size(bd) != N or value.size(bd) != N or value.size(sd) != S:
            raise ValueError(f"key {list(key.shape)} and value {list(value.shape)} must match query's batch size and "
                             f"each other's sequence length")

        if is_causal and attn_mask is None:
            raise ValueError("is_causal=True is a hint that attn_mask is the causal mask and needs attn_mask (as in "
                             "PyTorch); pass attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(L)")
        q, k, v = self._project(query, key, value)
        if self.bias_k is not None:
            shape = (1, N, self.embed_dim) if sd == 0 else (N, 1, self.embed_dim)
            k = torch.cat([k, self.bias_k.reshape(1, 1, -1).expand(shape)], dim=sd)
            v = torch.cat([v, self.bias_v.reshape(1, 1, -1).expand(shape)], dim=sd)
        heads = lambda t: t.unflatten(-1, (self.num_heads, self.head_dim)).permute(bd, 2, sd, 3)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)  # [N, H, L|S, Dh] views
        if self.add_zero_attn:
            zeros = k.new_zeros(N, self.num_heads, 1, self.head_dim)
            k, v = torch.cat([k, zeros], dim=2), torch.cat([v, zeros], dim=2)
        pad = k.size(2) - S
        # The is_causal hint lets qkv skip reading attn_mask, unless bias_k / add_zero_attn appended
        # keys that the (padded) mask allows but a causal mask would not.
        is_causal = bool(is_causal) and pad == 0

        masks = []
        if attn_mask is not None and not is_causal:
            _check_tensor(attn_mask, "attn_mask")
            if attn_mask.dim() == 2 and tuple(attn_mask.shape) == (L, S):
                attn_mask = attn_mask.reshape(1, 1, L, S)
            elif attn_mask.dim() == 3 and tuple(attn_mask.shape) == (N * self.num_heads, L, S):
                attn_mask = attn_mask.reshape(N, self.num_heads, L, S)
            else:
                raise ValueError(f"attn_mask: shape {list(attn_mask.shape)} must be [{L}, {S}] or "
                                 f"[{N * self.num_heads}, {L}, {S}] (batch * num_heads, L, S)")
            masks.append(_mha_mask(attn_mask, "attn_mask"))
        if key_padding_mask is not None:
            _check_tensor(key_padding_mask, "key_padding_mask")
            if tuple(key_padding_mask.shape) != (N, S):
                raise ValueError(f"key_padding_mask: shape {list(key_padding_mask.shape)} must be [{N}, {S}] "
                                 f"(batch, source length)")
            masks.append(_mha_mask(key_padding_mask.reshape(N, 1, 1, S), "key_padding_mask"))
        if pad:
            masks = [F.pad(m, (0, pad), value=False if m.dtype == torch.bool else 0.0) for m in masks]
        keep, bias = _merge_masks(masks)

        layout = _Layout(q, k, v, False)
        extras = _extras(bool(is_causal), "top_left", None, None, None, None, None)
        out, lse = _attention(q, k, v, layout, keep, bias, extras, None, None)
        out = out.permute(bd, 2, sd, 3) if bd == 0 else out.permute(2, 0, 1, 3)
        out = F.linear(out.reshape(*out.shape[:2], self.embed_dim), self.out_proj.weight, self.out_proj.bias)
        weights = self._weights(q, k, keep, bias, extras, lse, average_attn_weights) if need_weights else None
        if not batched:
            out = out.squeeze(bd)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights

    def _project(self, query, key, value):
        if self._qkv_same_embed_dim:
            if query is key and key is value:
                return F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
            w = self.in_proj_weight.chunk(3)
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        b = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        return F.linear(query, w[0], b[0]), F.linear(key, w[1], b[1]), F.linear(value, w[2], b[2])

    @torch.no_grad()
    def _weights(self, q, k, keep, bias, extras, lse, average):
        """The exact [N, H, L, S] softmax weights (averaged over heads if `average`), not differentiable."""
        if q.dtype == torch.float64:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
            if bias is not None:
                s = s + bias
            if keep is not None:
                s = s.masked_fill(~keep, -math.inf)
            if extras["causal"]:
                s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
            empty = torch.isneginf(s).all(dim=-1, keepdim=True)
            w = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
        else:
            shape = (q.size(0), q.size(1), q.size(2), k.size(2))
            mask = dict(extras, keep_mask=None if keep is None else _numpy(keep.expand(shape)),
                        bias=None if bias is None else _mask_numpy(bias.expand(shape), q.dtype))
            widen = (lambda t: _numpy(t.float())) if q.dtype == torch.bfloat16 else _numpy
            lse_np = None if q.dtype == torch.bfloat16 else _numpy(lse)
            w = torch.from_numpy(_qkv.attention_weights(widen(q), widen(k), None, None, lse_np, mask, None,
                                                        torch.get_num_threads())).to(q.dtype)
        return w.mean(dim=1) if average else w
