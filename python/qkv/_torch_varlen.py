"""qkv.torch.varlen_attention: packed variable-length attention with autograd, with the argument
names of FlashAttention's flash_attn_varlen_func."""
import torch

from . import _qkv
from .attention import _mask_dict
from .torch import _extras  # the seed rule of every qkv.torch call (torch.py imports this module last)


class _VarlenFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, mask, scale, num_threads):
        dtype = q.dtype
        q32, k32, v32 = (t.detach().float().contiguous() for t in (q, k, v))
        out, lse = _qkv.varlen_forward(q32.numpy(), k32.numpy(), v32.numpy(), cu_q, cu_k, mask, scale, num_threads)
        out, lse = torch.from_numpy(out), torch.from_numpy(lse)
        ctx.save_for_backward(q32, k32, v32, out, lse)
        ctx.args = (cu_q, cu_k, mask, scale, num_threads, dtype)
        ctx.mark_non_differentiable(lse)
        return out.to(dtype), lse.float()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        cu_q, cu_k, mask, scale, num_threads, dtype = ctx.args
        grads = _qkv.varlen_backward(q.numpy(), k.numpy(), v.numpy(), dout.float().contiguous().numpy(), out.numpy(),
                                     lse.numpy(), cu_q, cu_k, mask, scale, num_threads)
        return (*(torch.from_numpy(g).to(dtype) for g in grads), None, None, None, None, None)


def _offsets(cu, name):
    if isinstance(cu, torch.Tensor):
        if cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be a 1-D int32 or int64 tensor, got {cu.dtype} of shape {list(cu.shape)}")
        return [int(x) for x in cu.tolist()]
    return list(cu)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0,
                     softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                     deterministic=True, return_attn_probs=False, *, num_threads=None, return_lse=False):
    """Packed variable-length attention on CPU with autograd, as flash_attn_varlen_func takes it.

    q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] (float32; bfloat16 and float16 run
    the float32 kernels on widened copies, results rounded back once); cu_seqlens_q / _k: int32 or
    int64 offsets [batch + 1] of each sequence's rows (sequence s: rows cu[s]:cu[s+1], attending to
    its own keys only). causal: aligned to the bottom right as in FlashAttention >= 2.1 (the last
    query of a sequence sees all of its keys). window_size=(left, right), -1 = unbounded; softcap
    0 = off; alibi_slopes [H]; dropout_p as qkv.torch.scaled_dot_product_attention (its seed drawn
    from torch's default generator). max_seqlen_* are accepted for compatibility and checked when
    given; deterministic is always true (the same bits for any thread count). return_lse=True also
    returns lse [H, total_q] (float32, not differentiable). return_attn_probs is not supported: the
    dropout mask is qkv.dropout_mask's, per sequence with the sequence as batch row.
    """
    if return_attn_probs:
        raise ValueError("return_attn_probs is not supported: qkv.dropout_mask((1, H, n_q, n_k), dropout_p, seed) "
                         "gives a sequence's dropout mask, attention weights come from qkv.attention_weights")
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            raise TypeError(f"{name} must be a CPU torch.Tensor")
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"{name}: dtype {t.dtype} is not supported; pass float32, bfloat16 or float16")
    cu_q, cu_k = _offsets(cu_seqlens_q, "cu_seqlens_q"), _offsets(cu_seqlens_k, "cu_seqlens_k")
    for cu, most, name in ((cu_q, max_seqlen_q, "max_seqlen_q"), (cu_k, max_seqlen_k, "max_seqlen_k")):
        longest = max((b - a for a, b in zip(cu, cu[1:])), default=0)
        if most is not None and longest > int(most):
            raise ValueError(f"{name} = {most}, but a sequence has {longest} rows")
    window = None
    if window_size is not None and tuple(window_size) != (-1, -1):
        left, right = window_size
        window = (None if left < 0 else int(left), None if right < 0 else int(right))
    extras = _extras(False, "bottom_right", None, None, None, None, None, dropout_p)
    mask = _mask_dict(bool(causal), "bottom_right", None, None, window, None, None, alibi_slopes,
                      softcap if softcap else None, extras.get("dropout_p", 0.0), extras.get("dropout_seed"))
    if num_threads is None:
        num_threads = torch.get_num_threads()
    out, lse = _VarlenFunction.apply(q, k, v, cu_q, cu_k, mask, softmax_scale, num_threads)
    return (out, lse) if return_lse else out
