"""qkv.torch's checks of its arguments and its refusals in backward, shared by every front end
(scaled_dot_product_attention, MultiheadAttention, varlen_attention, ring_attention, the qkv::
operators). A leaf module: it imports no other part of qkv.torch, so each of those can import it
at the top without a cycle."""
import functools

import torch

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _dropout_seed():
    """The seed of one call's keep-mask, drawn from torch's default generator: every front end draws
    it here, so torch.manual_seed(s) replays a run whichever front end (or ring rank 0) drew it."""
    return int(torch.empty((), dtype=torch.int64).random_())


def _autocast(*tensors):
    """The tensors as CPU autocast hands them to an operator on its lower-precision list, as PyTorch
    lists scaled_dot_product_attention: inside torch.autocast("cpu"), floating tensors other than
    float64 in autocast's dtype (bfloat16), so float32 projections, bfloat16 activations and a float32
    rotary table meet in one dtype; outside it, unchanged. The casts are differentiable."""
    if not torch.is_autocast_cpu_enabled():
        return tensors
    dtype = torch.get_autocast_cpu_dtype()
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                 else t for t in tensors)


def _raising(value_error, type_error):
    """Re-raises the ValueError or TypeError of the decorated function as value_error / type_error
    (same message and traceback): the checks stay plain ValueError / TypeError in one place."""

    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (value_error, type_error):
                raise
            except ValueError as e:
                raise value_error(*e.args).with_traceback(e.__traceback__) from None
            except TypeError as e:
                raise type_error(*e.args).with_traceback(e.__traceback__) from None

        return call

    return wrap


_TORCH_SDPA = "torch.nn.functional.scaled_dot_product_attention (PyTorch >= 2.0)"


def _check_tensor(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on device '{t.device}': qkv.torch computes on CPU tensors only; pass "
                         f"{name}.cpu(), or use {_TORCH_SDPA} for {t.device.type} tensors")
    if t.layout != torch.strided:
        raise TypeError(f"{name}: layout {t.layout} is not supported; pass a dense tensor ({name}.to_dense())")


def _check_inputs(q, k, v, names=("query", "key", "value"), dtypes=_DTYPES):
    """Type, device, layout and dtype of query, key and value (named `names`), and one dtype for all three."""
    for t, name in zip((q, k, v), names):
        _check_tensor(t, name)
        if t.dtype not in dtypes:
            kinds = [str(d).replace("torch.", "") for d in dtypes]
            kinds = ", ".join(kinds[:-1]) + " or " + kinds[-1]
            other = f", or {_TORCH_SDPA}" if dtypes is _DTYPES else ""
            raise TypeError(f"{name}: dtype {t.dtype} is not supported by qkv.torch; use {kinds} ({name}.float())"
                            f"{other}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"{names[0]}, {names[1]} and {names[2]} must share a dtype, got {q.dtype}, {k.dtype} and "
                        f"{v.dtype}")


def _check_qkv(q, k, v):
    _check_inputs(q, k, v)
    for t, name in ((q, "query"), (k, "key"), (v, "value")):
        if t.dim() < 2:
            raise ValueError(f"{name}: expected shape [..., seq, dim] (rank >= 2), got {list(t.shape)}")
    if k.size(-1) != q.size(-1):
        raise ValueError(f"query {list(q.shape)} and key {list(k.shape)} must have the same last dim E")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"key {list(k.shape)} and value {list(v.shape)} must have the same sequence length S")


def _vector_arg(x, name, integer):
    """alibi_slopes (integer=False) or key_lengths / query_lengths (integer=True) given as a tensor,
    as FlashAttention passes them, in the list form qkv's checks take; anything else unchanged (those
    checks name it). Slopes get no gradient, so a tensor that requires one is refused, not ignored."""
    if not isinstance(x, torch.Tensor):
        return x
    _check_tensor(x, name)
    if integer and (x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool):
        raise TypeError(f"{name}: dtype {x.dtype} is not supported; pass an integer tensor (int32 or int64)")
    if not integer and not x.dtype.is_floating_point:
        raise TypeError(f"{name}: dtype {x.dtype} is not supported; pass a floating-point tensor (float32)")
    if x.dim() != 1 and not (integer and x.dim() == 0):
        each = "batch row" if integer else "query head"
        raise ValueError(f"{name}: expected a 1-D tensor of one entry per {each}, got shape "
                         f"{[int(n) for n in x.shape]}")
    if x.requires_grad:
        raise ValueError(f"{name} requires grad, but qkv computes no gradient for it; pass {name}.detach()")
    return x.tolist()


def _scalar(x):
    """A 0-d tensor as its Python number (PyTorch's argument parser takes one for a float)."""
    return x.item() if isinstance(x, torch.Tensor) and x.dim() == 0 else x


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


def _first_order_only(grads, anchors, what):
    """The gradients a qkv autograd function's backward returns, marked as not differentiable when
    the backward's own graph is being built (create_graph=True). torch's once_differentiable hangs
    its error node off fresh leaves, which no path from q, k or v reaches: differentiating a gradient
    then silently gave 0 (a gradient penalty lost its term). Here the one error node has edges to
    every anchor that requires grad (the function's inputs and output gradients), so any use of a
    gradient's own gradient runs it and raises."""
    anchors = [t for t in anchors if isinstance(t, torch.Tensor) and t.requires_grad]
    present = [g for g in grads if g is not None]
    if not torch.is_grad_enabled() or not anchors or not present:
        return grads
    err = torch._C._functions.DelayedError(
        f"qkv.torch: second-order gradients are not supported (the gradients of {what} were built with "
        f"create_graph=True and are now being differentiated)".encode(), len(present) + len(anchors))
    marked = iter(err(*present, *anchors)[:len(present)])
    return tuple(None if g is None else next(marked) for g in grads)


def _refuse_lse_gradient(dlse, what):
    """lse is returned differentiable only so that a loss term on it is refused here instead of being
    taken as a constant. Its gradient (d lse_i / d s_ij = P_ij: dS = P * (dP - (D - dlse))) is not
    one qkv's backward kernels take: the fused kernel sets the logit gradient of a row whose mask
    leaves it one key to exactly 0 (right for out alone, not with an lse term), and the float64
    reference recomputes the forward. A zero gradient is no term."""
    if _uses_lse(dlse):
        raise RuntimeError(_lse_gradient_message(what))


def _uses_lse(dlse):
    """Whether a loss term reached lse (a zero gradient is no term)."""
    return dlse is not None and bool(dlse.any())


def _lse_gradient_message(what):
    return (f"qkv.torch.{what}: a loss term uses lse, whose gradient qkv does not compute; detach lse "
            f"(lse.detach()) to use it as a constant")
