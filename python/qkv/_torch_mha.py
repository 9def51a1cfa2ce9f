"""qkv.torch.MultiheadAttention: torch.nn.MultiheadAttention whose attention runs in qkv (the
module docstring of qkv.torch says what it reads in place and what it copies)."""

import functools
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import _qkv
# qkv.torch's attention and its exception classes (torch.py imports this module after defining
# them), and the checks every front end shares.
from ._torch_checks import _autocast, _check_inputs, _check_tensor, _raising
from .torch import (MhaTypeError, MhaValueError, _attention, _dropped, _extras, _Layout, _mask_numpy, _numpy)


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


def _mha_source(floats, index):
    """The caller's float mask holding element `index` (n, h, i, j) of the merged bias, and its index
    there: when both masks are float, the one whose element there qkv's rule refuses."""
    for name, mask, where in floats:
        x = float(mask[where(*index)])
        if math.isnan(x) or x == math.inf or len(floats) == 1:
            return name, where(*index)
    return floats[0][0], floats[0][2](*index)


def _linear(x, weight, bias):
    """F.linear; float16 runs in float32 and rounds once, as qkv's float16 attention does (PyTorch's
    CPU matmul has no float16 kernel before 2.0, and rounding once is the more accurate anyway)."""
    if x.dtype != torch.float16:
        return F.linear(x, weight, bias)
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).half()


def _check_parameters(m):
    """The module's parameters agree with each other (a module built by its constructor always does;
    the qkv::multihead_attention operator takes them as arguments, and attributes can be reassigned)."""
    E, H = m.embed_dim, m.num_heads
    if not isinstance(H, int) or H < 1 or E % H:
        raise ValueError(f"num_heads: {H} must be a positive divisor of embed_dim={E}")
    if (m.bias_k is None) != (m.bias_v is None):
        raise ValueError("bias_k and bias_v: give both (add_bias_kv=True) or neither")
    if m._qkv_same_embed_dim:
        projections = (("in_proj_weight", m.in_proj_weight, [3 * E, E]),)
    else:
        projections = tuple((name, t, [E, dim]) for name, t, dim in (
            ("q_proj_weight", m.q_proj_weight, E), ("k_proj_weight", m.k_proj_weight, m.kdim),
            ("v_proj_weight", m.v_proj_weight, m.vdim)))
    required = projections + (("out_proj.weight", m.out_proj.weight, [E, E]),)
    optional = (("in_proj_bias", m.in_proj_bias, [3 * E]), ("bias_k", m.bias_k, [1, 1, E]),
                ("bias_v", m.bias_v, [1, 1, E]), ("out_proj.bias", m.out_proj.bias, [E]))
    dtype = required[0][1].dtype if required[0][1] is not None else None
    for name, t, shape in required + optional:
        if t is None:
            if any(name == r[0] for r in required):
                raise ValueError(f"{name}: missing (give in_proj_weight, or q_proj_weight, k_proj_weight and "
                                 f"v_proj_weight, and out_proj.weight)")
            continue
        if list(t.shape) != shape:
            raise ValueError(f"{name}: shape {list(t.shape)} must be {shape} (embed_dim={E})")
        if t.dtype != dtype:
            raise TypeError(f"{name}: dtype {t.dtype} is not the module's ({dtype})")


class _WeightsWithoutGradient(torch.autograd.Function):
    """MultiheadAttention's returned weights, differentiable only so that a loss term on them is
    refused instead of being taken as a constant (PyTorch's are differentiable; an entropy penalty
    on them would silently do nothing). `anchor` is any input that requires grad."""

    @staticmethod
    def forward(ctx, weights, anchor):
        ctx.set_materialize_grads(False)
        return weights.clone()

    @staticmethod
    def backward(ctx, dweights):
        if dweights is not None and bool(dweights.any()):
            raise RuntimeError("qkv.torch.MultiheadAttention: a loss term uses the returned attention weights, which "
                               "qkv computes without a gradient; detach them (weights.detach()) to use them as "
                               "constants")
        return None, None


class MultiheadAttention(torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention whose attention runs in qkv (same constructor, parameters,
    state_dict keys and forward signature; load a torch.nn.MultiheadAttention's state_dict as is).

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
            average_attn_weights=True, is_causal=False) -> (attn_output, attn_weights or None)
    with PyTorch's meaning: masks True = NOT allowed (bool) or added (float); attn_mask [L, S] or
    [N * num_heads, L, S]; is_causal is a hint that attn_mask is the causal mask (attn_mask is then
    required, as in PyTorch, and checked as always, and qkv applies its causal mask instead of
    reading it).

    need_weights=True returns the exact softmax weights (recomputed in float64 by qkv's
    attention_weights and rounded to the module's dtype; float64 modules use the float64
    composite). They have no gradient: a loss term on them raises RuntimeError in backward (use
    weights.detach() for constants); need_weights=False (use it when training) skips that work.
    A float16 module runs its projections in float32 and rounds each result once (as its attention
    does), so it runs on a torch without a float16 CPU matmul.
    Dropout: a module with dropout > 0 drops attention weights in training mode, in qkv's kernels
    (see scaled_dot_product_attention); the returned weights are the dropped ones, as in PyTorch.
    Fully masked rows give zeros where PyTorch gives NaN; a float mask holding NaN or +inf raises
    MhaValueError naming that mask and the index in it ("key_padding_mask contains NaN at index
    (1, 3)"), where PyTorch returns NaN rows.

    Note: torch.nn.TransformerEncoderLayer's inference fast path (eval mode under no_grad) calls
    torch._transformer_encoder_layer_fwd with the layer's weights and never calls self_attn, so an
    instance of this class swapped into it runs only in training or with grad enabled.
    """

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[torch.Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        # TorchScript compiles only the taken branch of is_scripting(), so the eager code below
        # stays plain Python; traced and scripted modules call the qkv::multihead_attention
        # operator, whose kernel is that same eager code.
        if torch.jit.is_scripting() or torch.jit.is_tracing():
            result = self._op(query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                              is_causal)
        else:
            result = self._forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        return result

    def _op(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_padding_mask: Optional[torch.Tensor],
            need_weights: bool, attn_mask: Optional[torch.Tensor], average_attn_weights: bool,
            is_causal: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        # The tracer records no optional outputs: the operator returns an empty tensor for no weights.
        out, weights = torch.ops.qkv.multihead_attention(
            query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal,
            self.num_heads, self.batch_first, self.add_zero_attn, self.dropout, self.training, self.in_proj_weight,
            self.in_proj_bias, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight, self.bias_k, self.bias_v,
            self.out_proj.weight, self.out_proj.bias)
        return out, (weights if need_weights else None)

    @_raising(MhaValueError, MhaTypeError)
    def _forward(self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                 is_causal):
        _check_parameters(self)
        # Under autocast the inputs meet in its dtype, and the projections (F.linear, on autocast's
        # list) cast the module's weights to it, as in torch.nn.MultiheadAttention.
        query, key, value = _autocast(query, key, value)
        _check_inputs(query, key, value)
        weight = self.in_proj_weight if self._qkv_same_embed_dim else self.q_proj_weight
        if query.dtype != weight.dtype and not torch.is_autocast_cpu_enabled():
            raise TypeError(f"query: dtype {query.dtype} is not the module's ({weight.dtype}); convert one of them "
                            f"(module.to({query.dtype}) or query.to({weight.dtype}))")
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(f"query, key and value must all be batched (rank 3) or unbatched (rank 2), got shapes "
                             f"{list(query.shape)}, {list(key.shape)}, {list(value.shape)}")
        batched = query.dim() == 3
        bd = 0 if self.batch_first else 1  # batch dim, and 1 - bd is the sequence dim
        if not batched:
            if key_padding_mask is not None:
                _check_tensor(key_padding_mask, "key_padding_mask")
                if tuple(key_padding_mask.shape) != (key.size(0),):
                    raise ValueError(f"key_padding_mask: shape {list(key_padding_mask.shape)} must be [{key.size(0)}] "
                                     f"(source length) for unbatched inputs")
                key_padding_mask = key_padding_mask.unsqueeze(0)
            query, key, value = (t.unsqueeze(bd) for t in (query, key, value))
        sd = 1 - bd
        N, L, S = query.size(bd), query.size(sd), key.size(sd)
        if query.size(-1) != self.embed_dim:
            raise ValueError(f"query: last dim {query.size(-1)} must be embed_dim={self.embed_dim}")
        for name, t, dim_name, dim in (("key", key, "kdim", self.kdim), ("value", value, "vdim", self.vdim)):
            if t.size(-1) != dim:
                raise ValueError(f"{name}: last dim {t.size(-1)} must be {dim_name}={dim}")
        if key.size(bd) != N or value.size(bd) != N or value.size(sd) != S:
            raise ValueError(f"key {list(key.shape)} and value {list(value.shape)} must match query's batch size and "
                             f"each other's sequence length")

        is_causal = _qkv._flag_arg(is_causal, "is_causal")
        if is_causal and attn_mask is None:
            raise ValueError("is_causal=True is a hint that attn_mask is the causal mask and needs attn_mask (as in "
                             "PyTorch); pass attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(L)")
        q, k, v = self._project(query, key, value)
        if self.bias_k is not None:
            shape = (1, N, self.embed_dim) if sd == 0 else (N, 1, self.embed_dim)
            k = torch.cat([k, self.bias_k.to(k.dtype).reshape(1, 1, -1).expand(shape)], dim=sd)
            v = torch.cat([v, self.bias_v.to(v.dtype).reshape(1, 1, -1).expand(shape)], dim=sd)
        heads = lambda t: t.unflatten(-1, (self.num_heads, self.head_dim)).permute(bd, 2, sd, 3)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)  # [N, H, L|S, Dh] views
        if self.add_zero_attn:
            zeros = k.new_zeros(N, self.num_heads, 1, self.head_dim)
            k, v = torch.cat([k, zeros], dim=2), torch.cat([v, zeros], dim=2)
        pad = k.size(2) - S
        # The is_causal hint lets qkv skip reading attn_mask, unless bias_k / add_zero_attn appended
        # keys that the (padded) mask allows but a causal mask would not.
        is_causal = is_causal and pad == 0

        masks = []
        floats = []  # (name, the caller's float mask, its index of score (n, h, i, j))
        H = self.num_heads
        if attn_mask is not None:  # checked even when the is_causal hint means it is not read
            _check_tensor(attn_mask, "attn_mask")
            _mha_mask(attn_mask, "attn_mask")
            if attn_mask.is_floating_point() and not is_causal:
                where = (lambda n, h, i, j: (i, j)) if attn_mask.dim() == 2 else (lambda n, h, i, j: (n * H + h, i, j))
                floats.append(("attn_mask", attn_mask, where))
            if attn_mask.dim() == 2 and tuple(attn_mask.shape) == (L, S):
                attn_mask = attn_mask.reshape(1, 1, L, S)
            elif attn_mask.dim() == 3 and tuple(attn_mask.shape) == (N * self.num_heads, L, S):
                attn_mask = attn_mask.reshape(N, self.num_heads, L, S)
            else:
                raise ValueError(f"attn_mask: shape {list(attn_mask.shape)} must be [{L}, {S}] or "
                                 f"[{N * self.num_heads}, {L}, {S}] (batch * num_heads, L, S)")
            if not is_causal:
                masks.append(attn_mask)
        if key_padding_mask is not None:
            _check_tensor(key_padding_mask, "key_padding_mask")
            if tuple(key_padding_mask.shape) != (N, S):
                raise ValueError(f"key_padding_mask: shape {list(key_padding_mask.shape)} must be [{N}, {S}] "
                                 f"(batch, source length)")
            if key_padding_mask.is_floating_point():
                user = key_padding_mask if batched else key_padding_mask[0]
                floats.append(("key_padding_mask", user, (lambda n, h, i, j: (n, j)) if batched else
                               (lambda n, h, i, j: (j,))))
            masks.append(_mha_mask(key_padding_mask.reshape(N, 1, 1, S), "key_padding_mask"))
        if pad:
            masks = [F.pad(m, (0, pad), value=False if m.dtype == torch.bool else 0.0) for m in masks]
        keep, bias = _merge_masks(masks)

        layout = _Layout(q, k, v, False)
        extras = _extras(bool(is_causal), "top_left", None, None, None, None, None,
                         self.dropout if self.training else 0.0)
        out, _ = _attention(q, k, v, layout, keep, bias, extras, None, None, functools.partial(_mha_source, floats))
        out = out.permute(bd, 2, sd, 3) if bd == 0 else out.permute(2, 0, 1, 3)
        out = _linear(out.reshape(*out.shape[:2], self.embed_dim), self.out_proj.weight, self.out_proj.bias)
        weights = self._weights(q, k, keep, bias, extras, average_attn_weights) if need_weights else None
        anchor = next((t for t in (q, k, v, bias) if t is not None and t.requires_grad), None)
        if weights is not None and torch.is_grad_enabled() and anchor is not None:
            weights = _WeightsWithoutGradient.apply(weights, anchor)
        if not batched:
            out = out.squeeze(bd)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights

    def _project(self, query, key, value):
        if self._qkv_same_embed_dim:
            if query is key and key is value:
                return _linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
            w = self.in_proj_weight.chunk(3)
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        b = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        return _linear(query, w[0], b[0]), _linear(key, w[1], b[1]), _linear(value, w[2], b[2])

    @torch.no_grad()
    def _weights(self, q, k, keep, bias, extras, average):
        """The exact [N, H, L, S] softmax weights (averaged over heads if `average`), with no gradient.
        Each row's normalizer is recomputed in float64: the forward's float32 lse is off by half an
        ulp of |lse|, in every weight (a -1e9 mask on a row puts that at 32)."""
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
            widen = (lambda t: _numpy(t.float())) if q.dtype in (torch.bfloat16, torch.float16) else _numpy
            w = torch.from_numpy(_qkv.attention_weights(widen(q), widen(k), None, None, None, mask, None,
                                                        torch.get_num_threads())).to(q.dtype)
        w = _dropped(w, extras)
        return w.mean(dim=1) if average else w


MultiheadAttention.__module__ = "qkv.torch"  # its public name, kept by pickles of whole modules
