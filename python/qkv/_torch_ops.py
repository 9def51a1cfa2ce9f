"""qkv.torch's attention as PyTorch operators in the namespace qkv, so torch.jit.trace records a call
as one qkv:: node and torch.jit.script compiles it to that operator (the graph calls qkv, and a
saved module runs wherever `import qkv.torch` has registered the operators).

Each operator's kernel is the eager function itself, registered as CompositeImplicitAutograd: its
torch.autograd.Function records the backward, so gradients flow through traced and scripted
modules as in eager mode, and every argument check stays in one place. Torch 1.13 has no
torch.compile, so there is no meta or fake-tensor kernel.

Schemas mirror the public signatures. Options added later (dropout's generator state, a packed
variable-length form as an operator of its own) go in as keyword-only arguments with defaults, so
graphs saved before still load and run.
"""

import functools
import sys
import types
import warnings

import torch

from . import _qkv
from . import torch as _qt

_lib = torch.library.Library("qkv", "DEF")

_SDPA = ("Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, "
         "float? scale=None, bool enable_gqa=False, *, int[]? window=None, float[]? alibi_slopes=None, "
         "float? softcap=None, int[]? key_lengths=None, int[]? query_lengths=None, "
         "str causal_align=\"top_left\", int? num_threads=None, int? key_length=None, int? query_length=None")
_lib.define(f"scaled_dot_product_attention({_SDPA}) -> Tensor")
_lib.define(f"scaled_dot_product_attention.lse({_SDPA}, bool return_lse) -> (Tensor, Tensor)")
_VARLEN = ("Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int? max_seqlen_q=None, "
           "int? max_seqlen_k=None, float dropout_p=0.0, float? softmax_scale=None, bool causal=False, "
           "int[] window_size=[-1, -1], float softcap=0.0, float[]? alibi_slopes=None, bool deterministic=True, "
           "bool return_attn_probs=False, *, int? num_threads=None")
_lib.define(f"varlen_attention({_VARLEN}) -> Tensor")
_lib.define(f"varlen_attention.lse({_VARLEN}, bool return_lse) -> (Tensor, Tensor)")
_lib.define("multihead_attention(Tensor query, Tensor key, Tensor value, Tensor? key_padding_mask, bool need_weights, "
            "Tensor? attn_mask, bool average_attn_weights, bool is_causal, int num_heads, bool batch_first, "
            "bool add_zero_attn, float dropout, bool training, Tensor? in_proj_weight, Tensor? in_proj_bias, "
            "Tensor? q_proj_weight, Tensor? k_proj_weight, Tensor? v_proj_weight, Tensor? bias_k, Tensor? bias_v, "
            "Tensor out_proj_weight, Tensor? out_proj_bias) -> (Tensor, Tensor)")


def _kernel(name):
    """The decorated function as the kernel of operator qkv::name. Torch 1.13 hands TorchScript a
    Python kernel's exception with an empty message (only a Python caller, through torch.ops, gets
    the exception itself), so when TorchScript is the caller the message goes out as a warning
    before the interpreter raises its RuntimeError."""

    def wrap(fn):
        @functools.wraps(fn)
        def kernel(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if sys._getframe(1).f_code.co_filename != torch._ops.__file__:
                    warnings.warn(f"qkv::{name}: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)
                raise

        _lib.impl(name, kernel, "CompositeImplicitAutograd")
        return kernel

    return wrap


def _kernels(name, fn):
    """The kernels of qkv::name (fn's output) and of its overload qkv::name.lse (fn's output and lse)."""

    @_kernel(name)
    def plain(*args, **kwargs):
        return fn(*args, **kwargs)

    @_kernel(f"{name}.lse")
    def with_lse(*args, return_lse, **kwargs):
        if not return_lse:
            raise _qt.SdpaValueError(f"qkv::{name}.lse is the return_lse=True form; call qkv.torch.{name} without "
                                     "return_lse for the output alone")
        return fn(*args, return_lse=True, **kwargs)


def _sdpa(*args, key_length=None, query_length=None, **kwargs):
    """scaled_dot_product_attention with key_length / query_length, the schema's form of one length
    for every batch row (the eager call's int), so a traced graph takes other batch sizes."""
    for one, name in ((key_length, "key_lengths"), (query_length, "query_lengths")):
        if one is not None:
            if kwargs.get(name) is not None:
                raise _qt.SdpaValueError(f"qkv::scaled_dot_product_attention: give {name} or {name[:-1]}, not both")
            kwargs[name] = one
    return _qt.scaled_dot_product_attention(*args, **kwargs)


_kernels("scaled_dot_product_attention", _sdpa)
_kernels("varlen_attention", _qt.varlen_attention)


class _MhaParams:
    """What MultiheadAttention._forward reads of its module, rebuilt from the operator's arguments."""

    _forward = _qt.MultiheadAttention._forward
    _project = _qt.MultiheadAttention._project
    _weights = _qt.MultiheadAttention._weights

    def __init__(self, num_heads, batch_first, add_zero_attn, dropout, training, in_proj_weight, in_proj_bias,
                 q_proj_weight, k_proj_weight, v_proj_weight, bias_k, bias_v, out_proj_weight, out_proj_bias):
        self.num_heads, self.batch_first, self.add_zero_attn = num_heads, batch_first, add_zero_attn
        self.dropout, self.training = dropout, training
        self.in_proj_weight, self.in_proj_bias = in_proj_weight, in_proj_bias
        self.q_proj_weight, self.k_proj_weight, self.v_proj_weight = q_proj_weight, k_proj_weight, v_proj_weight
        self.bias_k, self.bias_v = bias_k, bias_v
        self.out_proj = types.SimpleNamespace(weight=out_proj_weight, bias=out_proj_bias)
        # Sizes read from the arguments as given; _forward checks that they agree.
        self._qkv_same_embed_dim = in_proj_weight is not None
        self.embed_dim = out_proj_weight.size(0)
        self.head_dim = self.embed_dim // num_heads if num_heads > 0 else 0
        self.kdim, self.vdim = (self.embed_dim if self._qkv_same_embed_dim or w is None or w.dim() != 2 else w.size(1)
                                for w in (k_proj_weight, v_proj_weight))


@_kernel("multihead_attention")
def _mha_kernel(query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal,
                *module):
    out, weights = _MhaParams(*module)._forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                                average_attn_weights, is_causal)
    return out, query.new_empty(0) if weights is None else weights


# TorchScript compiles a call of the Python function as a call of the operator (as it does for
# torch.nn.functional's functions and their aten:: operators).
torch.jit._builtins._register_builtin(_qt.scaled_dot_product_attention, "qkv::scaled_dot_product_attention")
torch.jit._builtins._register_builtin(_qt.varlen_attention, "qkv::varlen_attention")


def _plain(x):
    """A numpy array or scalar (which the eager call takes) as a Python list or number."""
    return x.tolist() if hasattr(x, "tolist") and not isinstance(x, torch.Tensor) else x


def _listed(x, name, convert):
    """A sequence (or one number) as the list the schema takes, each entry through qkv's own check
    (convert(entry, name), so 3.7 is refused as a length, not truncated); None stays None."""
    if x is None:
        return None
    x = _plain(x)
    if isinstance(x, (list, tuple)):
        return [convert(e, f"{name}[{i}]") for i, e in enumerate(x)]
    return [convert(x, name)]


def _window_side(w, name):
    return -1 if w is None else _qkv._index_arg(w, name)


def traced_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window, alibi_slopes, softcap,
                key_lengths, query_lengths, causal_align, return_lse, num_threads):
    """The operator call torch.jit.trace records: the Python forms the eager function accepts (a
    window side None, slopes and lengths as tensors or tuples) in the schema's types, by the eager
    call's checks; the kernel then checks every value as the eager call does."""
    lengths = {}
    for x, name in ((key_lengths, "key_lengths"), (query_lengths, "query_lengths")):
        x = _plain(_qt._vector_arg(x, name, True))
        if x is None or isinstance(x, (list, tuple)):
            lengths[name] = _listed(x, name, _qkv._index_arg)
        else:
            # One length for every batch row, as key_length / query_length: a list of B entries
            # would freeze the traced batch size into the graph.
            lengths[name[:-1]] = _qkv._index_arg(x, name)
    kwargs = dict(window=_listed(window, "window", _window_side),
                  alibi_slopes=_listed(_qt._vector_arg(alibi_slopes, "alibi_slopes", False), "alibi_slopes",
                                       _qkv._number_arg),
                  softcap=softcap, causal_align=causal_align, num_threads=num_threads, **lengths)
    args = (query, key, value, attn_mask, _qkv._dropout_p_arg(_qt._scalar(dropout_p)),
            _qkv._flag_arg(is_causal, "is_causal"), scale, _qkv._flag_arg(enable_gqa, "enable_gqa"))
    if _qkv._flag_arg(return_lse, "return_lse"):
        return torch.ops.qkv.scaled_dot_product_attention.lse(*args, return_lse=True, **kwargs)
    return torch.ops.qkv.scaled_dot_product_attention(*args, **kwargs)


def traced_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                  window_size, softcap, alibi_slopes, deterministic, return_attn_probs, num_threads, return_lse):
    """The operator call torch.jit.trace records for varlen_attention: cu_seqlens as tensors, so a
    traced model takes other sequence lengths as inputs (offsets given as lists become constants
    of the graph), and the dropout seed drawn by the kernel at each call; the kernel then checks
    every value as the eager call does."""
    cu = [c if isinstance(c, torch.Tensor) else torch.tensor(list(c), dtype=torch.int64)
          for c in (cu_seqlens_q, cu_seqlens_k)]
    window = [-1, -1] if window_size is None else _listed(list(window_size), "window_size", _window_side)
    args = (q, k, v, *cu,
            None if max_seqlen_q is None else _qkv._index_arg(_qt._scalar(max_seqlen_q), "max_seqlen_q"),
            None if max_seqlen_k is None else _qkv._index_arg(_qt._scalar(max_seqlen_k), "max_seqlen_k"),
            _qkv._dropout_p_arg(_qt._scalar(dropout_p)),
            None if softmax_scale is None else _qkv._number_arg(_qt._scalar(softmax_scale), "softmax_scale"),
            _qkv._flag_arg(causal, "causal"), window, _qkv._number_arg(_qt._scalar(softcap), "softcap"),
            _listed(_qt._vector_arg(alibi_slopes, "alibi_slopes", False), "alibi_slopes", _qkv._number_arg),
            _qkv._flag_arg(deterministic, "deterministic"), _qkv._flag_arg(return_attn_probs, "return_attn_probs"))
    if _qkv._flag_arg(return_lse, "return_lse"):
        return torch.ops.qkv.varlen_attention.lse(*args, num_threads=num_threads, return_lse=True)
    return torch.ops.qkv.varlen_attention(*args, num_threads=num_threads)
