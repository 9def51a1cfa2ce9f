"""qkv.torch.varlen_attention: packed variable-length attention with autograd, with the argument
names of FlashAttention's flash_attn_varlen_func."""
import re

import torch

from . import _qkv
from .attention import _mask_dict
# qkv.torch's own rules: the checks of q, k, v and tensor arguments and what its autograd functions
# share (from the leaf module), the seed of every call and its exception classes (torch.py imports
# this module last, so they are defined by then).
from ._torch_checks import _autocast, _check_inputs, _first_order_only, _raising, _refuse_lse_gradient, _scalar
from .torch import SdpaTypeError, SdpaValueError, _extras

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class _VarlenFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, mask, scale, num_threads):
        dtype = q.dtype
        q32, k32, v32 = (t.detach().float().contiguous() for t in (q, k, v))
        out, lse = _qkv.varlen_forward(q32.numpy(), k32.numpy(), v32.numpy(), cu_q, cu_k, mask, scale, num_threads)
        out, lse = torch.from_numpy(out), torch.from_numpy(lse)
        ctx.save_for_backward(q, k, v, q32, k32, v32, out, lse)
        ctx.args = (cu_q, cu_k, mask, scale, num_threads, dtype)
        ctx.set_materialize_grads(False)
        return out.to(dtype), lse.float()

    @staticmethod
    def backward(ctx, dout, dlse):
        with torch.no_grad():
            grads = _VarlenFunction._backward(ctx, dout, dlse)
        return _first_order_only(grads, (*ctx.saved_tensors[:3], dout, dlse), "varlen_attention")

    @staticmethod
    def _backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors[3:]
        cu_q, cu_k, mask, scale, num_threads, dtype = ctx.args
        _refuse_lse_gradient(dlse, "varlen_attention")
        if dout is None:  # only lse was used, and with a zero gradient
            return (None,) * 8
        grads = _qkv.varlen_backward(q.numpy(), k.numpy(), v.numpy(), dout.float().contiguous().numpy(), out.numpy(),
                                     lse.numpy(), cu_q, cu_k, mask, scale, num_threads)
        return (*(torch.from_numpy(g).to(dtype) for g in grads), None, None, None, None, None)


def _offsets(cu, name):
    if isinstance(cu, torch.Tensor):
        if cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be a 1-D int32 or int64 tensor, got {cu.dtype} of shape {list(cu.shape)}")
        return [int(x) for x in cu.tolist()]
    return list(cu)


def _window(window_size):
    """FlashAttention's (left, right), -1 = unbounded, as qkv's window (None = unbounded)."""
    if window_size is None:
        return None
    try:
        sides = list(window_size)
    except TypeError:
        sides = None
    if sides is None or len(sides) != 2:
        raise TypeError(f"window_size must be a pair (left, right), -1 = unbounded, got {window_size!r}")
    left, right = (_qkv._index_arg(w, f"window_size[{i}]") for i, w in enumerate(sides))
    return None if left < 0 and right < 0 else (None if left < 0 else left, None if right < 0 else right)


@_raising(SdpaValueError, SdpaTypeError)
def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0,
                     softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                     deterministic=True, return_attn_probs=False, *, num_threads=None, return_lse=False):
    """Packed variable-length attention on CPU with autograd, as flash_attn_varlen_func takes it.

    q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] of one dtype (float32; bfloat16 and
    float16 run the float32 kernels on widened copies, results rounded back once); cu_seqlens_q /
    _k: int32 or int64 offsets [batch + 1] of each sequence's rows (sequence s: rows cu[s]:cu[s+1],
    attending to its own keys only). causal: aligned to the bottom right as in FlashAttention >= 2.1
    (the last query of a sequence sees all of its keys). window_size=(left, right), -1 = unbounded;
    softcap 0 = off; alibi_slopes [H] (a sequence or a 1-D float tensor); dropout_p as
    qkv.torch.scaled_dot_product_attention (its seed drawn from torch's default generator).
    max_seqlen_* are accepted for compatibility and checked when given; deterministic is always true
    (the same bits for any thread count). return_lse=True also returns lse [H, total_q] (float32);
    qkv computes no gradient for it: a loss term on lse raises RuntimeError in backward (use
    lse.detach()), as does differentiating the gradients (create_graph=True). Inside
    torch.autocast("cpu"), float32 and float16 inputs are cast to autocast's dtype first, as
    scaled_dot_product_attention's are. return_attn_probs is not supported: the
    dropout mask of sequence s is qkv.dropout_mask's for batch row s (see the error it raises).

    Raises SdpaTypeError / SdpaValueError (TypeError / ValueError and RuntimeError) naming the
    argument, as scaled_dot_product_attention does.

    torch.jit.trace records a call as one qkv::varlen_attention node (qkv::varlen_attention.lse with
    return_lse=True) whose cu_seqlens are graph inputs when given as tensors, and torch.jit.script
    compiles it to that operator.
    """
    q, k, v = _autocast(q, k, v)
    if torch.jit.is_tracing():
        from ._torch_ops import traced_varlen
        return traced_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                             softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                             return_attn_probs, num_threads, return_lse)
    if _qkv._flag_arg(return_attn_probs, "return_attn_probs"):
        raise ValueError("return_attn_probs is not supported: sequence s's dropout mask is "
                         "qkv.dropout_mask((s + 1, H, n_q, n_k), dropout_p, seed)[s] with n_q, n_k its lengths (the "
                         "sequence is batch row s; seed: the one this call drew from torch's default generator), and "
                         "attention weights come from qkv.attention_weights")
    _check_inputs(q, k, v, ("q", "k", "v"), _DTYPES)
    cu_q, cu_k = _offsets(cu_seqlens_q, "cu_seqlens_q"), _offsets(cu_seqlens_k, "cu_seqlens_k")
    for cu, most, name in ((cu_q, max_seqlen_q, "max_seqlen_q"), (cu_k, max_seqlen_k, "max_seqlen_k")):
        if most is None:
            continue
        most = _qkv._index_arg(_scalar(most), name)
        longest = max((b - a for a, b in zip(cu, cu[1:])), default=0)
        if longest > most:
            raise ValueError(f"{name} = {most}, but a sequence has {longest} rows")
    _qkv._flag_arg(deterministic, "deterministic")
    return_lse = _qkv._flag_arg(return_lse, "return_lse")
    extras = _extras(_qkv._flag_arg(causal, "causal"), "bottom_right", _window(window_size), alibi_slopes,
                     _scalar(softcap), None, None, dropout_p)
    mask = _mask_dict(extras["causal"], "bottom_right", None, None, extras["window"], None, None,
                      extras["alibi_slopes"], extras["softcap"], extras.get("dropout_p", 0.0),
                      extras.get("dropout_seed"))
    if num_threads is None:
        num_threads = torch.get_num_threads()
    try:
        scale = None if softmax_scale is None else _qkv._scale_arg(_scalar(softmax_scale))
        out, lse = _VarlenFunction.apply(q, k, v, cu_q, cu_k, mask, scale, num_threads)
    except (TypeError, ValueError) as e:
        # qkv's rules for a scale name it scale; this function's argument is softmax_scale.
        renamed = re.sub(r"^(\w+: )?scale\b", r"\1softmax_scale", str(e))
        if renamed == str(e):
            raise
        raise type(e)(renamed) from None
    return (out, lse) if return_lse else out
