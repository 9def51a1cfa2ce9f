"""Scaled dot-product attention on numpy arrays (forward, backward, exact weights)."""

import numpy as np

from . import _qkv
from ._keywords import suggest_keywords

_MASK_DOC = """
    Masks (all optional; they combine: a key is used only if every mask allows it):
      causal: bool. Query i sees keys j <= diag(i).
      causal_align: "top_left" (diag(i) = i) or "bottom_right" (diag(i) = i + M_b - N_b, where
          M_b, N_b are the valid key and query lengths of batch row b, so the last valid query
          sees every valid key, as when decoding with a cache). Also places the diagonal used by
          `window` and `alibi_slopes` when causal is False.
      key_lengths: int or sequence of B ints; keys j >= key_lengths[b] are masked.
      query_lengths: int or sequence of B ints; query rows i >= query_lengths[b] are fully masked.
      window: pair (left, right): query i sees keys diag(i) - left <= j <= diag(i) + right;
          None (or a negative bound) leaves that side unbounded.
      keep_mask: bool (or uint8) array broadcastable to [B, H, N, M]; True = may attend.
      bias: float32/float64 array broadcastable to [B, H, N, M], added to the scaled (and
          softcapped) scores; -inf removes a pair. float64 bias is rounded to float32. NaN, +inf
          or a finite value beyond float32's range raises ValueError (check_finite or not).
      alibi_slopes: sequence of H floats; adds -slope[h] * |j - diag(i)| to the scores.
      softcap: float c > 0: scores s become c * tanh(s / c) before bias and ALiBi (0/None: off).
    A query row with no allowed key gets output 0 and lse -inf (never NaN).
    Dropout (training): dropout_p in [0, 1) drops each softmax weight with that probability and
      scales the kept ones by 1 / (1 - dropout_p); which weights are dropped is a pure function of
      seed (an integer, required when dropout_p > 0), dropout_offset (default 0: count calls that
      share a seed) and the weight's batch row, head, query and key, so attention_backward given
      the same three regenerates the same mask, and qkv.dropout_mask returns it. lse is the
      softmax's without dropout. The same bits for any thread count.
"""


def _mask_dict(causal, causal_align, key_lengths, query_lengths, window, keep_mask, bias, alibi_slopes, softcap,
               dropout_p=0.0, seed=None, dropout_offset=0):
    return dict(causal=causal, causal_align=causal_align, key_lengths=key_lengths, query_lengths=query_lengths,
                window=window, keep_mask=keep_mask, bias=bias, alibi_slopes=alibi_slopes, softcap=softcap,
                dropout_p=dropout_p, dropout_seed=seed, dropout_offset=dropout_offset)


def dropout_mask(shape, dropout_p, seed, *, dropout_offset=0):
    """The keep-mask (bool, True = kept) that scaled_dot_product_attention(..., dropout_p=dropout_p,
    seed=seed, dropout_offset=dropout_offset) applies to softmax weights of shape [..., N, M]
    (rank 2 to 4: [N, M], [H, N, M] or [B, H, N, M], the scores' shape of that call). For tests and
    inspection, as FlashAttention's return_attn_probs: the output is
    ((softmax * mask) / (1 - dropout_p)) @ v."""
    return _qkv.dropout_mask(shape, dict(dropout_p=dropout_p, dropout_seed=seed, dropout_offset=dropout_offset))


@suggest_keywords
def scaled_dot_product_attention(q, k, v, *, causal=False, causal_align="top_left", key_lengths=None,
                                 query_lengths=None, window=None, keep_mask=None, bias=None, alibi_slopes=None,
                                 softcap=None, scale=None, return_lse=False, kernel="auto", num_threads=0,
                                 simd="auto", check_finite=False, dropout_p=0.0, seed=None, dropout_offset=0):
    """out = softmax(scale * q @ k^T + mask) @ v, like PyTorch's scaled_dot_product_attention.

    Shapes follow PyTorch: q [..., N, D], k [..., M, D], v [..., M, Dv] with the same rank 2, 3 or
    4; leading dims are [H] (rank 3) or [B, H] (rank 4), none means B = H = 1. k and v may have
    fewer heads than q (grouped-query attention: query head h uses key head h // (H // Hkv)).

    dtypes: q, k, v must share one of
      float32 - computed by qkv's fp32 kernel (zero-copy; results float32);
      float64 - computed by the float64 reference (results float64);
      uint16  - read as bfloat16 bit patterns (zero-copy) and run by the bf16 kernel: q·k
                products are exact and accumulate in fp32; on CPUs with AVX512_BF16 the softmax
                weights are rounded to bf16 for P·V (vdpbf16ps, or AMX tiles where the CPU
                has AMX-BF16; QKV_AMX=0 turns those off), so the result differs from
                float32 attention on the widened inputs by about 5e-4 relative to 1 + max|out|
                (N(0, 1) inputs), within FlashAttention's rule: at most twice the error of
                PyTorch's bf16 composite plus 1e-5. Without AVX512_BF16 the inputs are widened
                and the float32 kernel runs (fp32 rounding). Results float32.
    Any strides are read in place without copying (transposed [B, N, H, D] views, slices,
    negative steps, np.broadcast_to); only arrays numpy marks as unaligned are copied first.

    Args:
      scale: multiplies q @ k^T; default 1 / sqrt(D).
      return_lse: also return lse [..., N], the log-sum-exp of each row of masked, scaled scores:
          True gives it in the results' dtype; "float64" gives the kernel's m + log(l) before its
          rounding to fp32, which attention_backward needs to recompute the softmax to fp32
          accuracy when scores are large (one fp32 ulp of an lse of 100 is 7.6e-6).
      kernel: "auto" (fastest available), "reference" (float64 inside) or "fused".
      num_threads: threads for this call; 0 = qkv.default_num_threads().
      simd: "auto", "avx512", "avx2", "neon" or "scalar": forces the fused kernel's instruction set
          (ValueError if this CPU lacks it); qkv.simd_path() tells which one "auto" runs.
      check_finite: if True, a NaN or infinity in q, k or v raises ValueError naming the tensor
          and the index; if False, non-finite values propagate as IEEE arithmetic says.
    {mask}
    Returns out [..., N, Dv], or (out, lse) if return_lse.

    Raises TypeError for arguments of the wrong type or dtype (int, complex, float16 arrays, or q,
    k, v of different dtypes) and ValueError for inconsistent shapes or values. The GIL is
    released while computing, so other Python threads keep running.
    """
    mask = _mask_dict(causal, causal_align, key_lengths, query_lengths, window, keep_mask, bias, alibi_slopes, softcap,
                      dropout_p, seed, dropout_offset)
    if not (isinstance(return_lse, (bool, np.bool_)) or (isinstance(return_lse, str) and return_lse == "float64")):
        raise ValueError(f'return_lse must be False, True or "float64", got {return_lse!r}')
    lse64 = isinstance(return_lse, str)
    return _qkv.scaled_dot_product_attention(q, k, v, mask, scale, lse64 or bool(return_lse), lse64,
                                             kernel, num_threads, simd, check_finite)


scaled_dot_product_attention.__doc__ = scaled_dot_product_attention.__doc__.replace("{mask}", _MASK_DOC)


def _constant_along_keys(shape):
    """True for a bias shape with no key dim of its own (a scalar, or size 1 in the last dim). Such a
    bias shifts every softmax row by a constant, which no output depends on: its gradient is exactly
    zero. Summing the kernel's dbias would give only rounding noise (up to 2e-5 over a few hundred
    rows), where the exact answer costs nothing."""
    return len(shape) == 0 or shape[-1] == 1


def _reduce_to_shape(grad, shape):
    """Sums grad over the dims numpy broadcasting added or stretched to reach grad.shape from shape."""
    shape = tuple(shape)
    extra = grad.ndim - len(shape)
    if extra > 0:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad.reshape(shape)


@suggest_keywords
def attention_backward(q, k, v, dout, *, out=None, lse=None, causal=False, causal_align="top_left", key_lengths=None,
                       query_lengths=None, window=None, keep_mask=None, bias=None, alibi_slopes=None, softcap=None,
                       scale=None, return_dbias=False, kernel="auto", num_threads=0, simd="auto",
                       check_finite=False, dropout_p=0.0, seed=None, dropout_offset=0):
    """Gradients of a loss L through scaled_dot_product_attention, given dout = dL/dout.

    q, k, v and every mask and dropout argument are as for scaled_dot_product_attention (give the
    forward's dropout_p, seed and dropout_offset: the mask is regenerated); dout has out's shape
    [..., N, Dv] and dtype. out and lse are the forward's results for the same inputs (out float32;
    lse from return_lse="float64", or a float32 one, which at |lse| ~ 100 leaves up to 3.8e-6
    relative error in the recomputed softmax); when either is None the forward is run here first.
    float64 inputs use the float64 reference backward, which raises ValueError, as the forward does,
    when finite inputs (dout included) overflow float64 in a score or gradient.

    Returns (dq, dk, dv), shaped like q, k, v (for grouped-query attention dk and dv sum over the
    query heads of each group), or (dq, dk, dv, dbias) if return_dbias. dbias = dL/dbias has the
    shape of `bias` when a bias was given (summed over the dims it was broadcast along), else the
    full scores shape [..., N, M]. Fully masked rows contribute zero gradients.
    {mask}
    Raises TypeError / ValueError as scaled_dot_product_attention does (dout too). Releases the GIL.
    """
    mask = _mask_dict(causal, causal_align, key_lengths, query_lengths, window, keep_mask, bias, alibi_slopes, softcap,
                      dropout_p, seed, dropout_offset)
    zero_dbias = return_dbias and bias is not None and _constant_along_keys(np.shape(bias))
    grads = _qkv.attention_backward(q, k, v, dout, out, lse, mask, scale, return_dbias and not zero_dbias, kernel,
                                    num_threads, simd, check_finite)
    if zero_dbias:
        return (*grads, np.zeros(np.shape(bias), grads[0].dtype))
    if return_dbias and bias is not None:
        dq, dk, dv, dbias = grads
        return dq, dk, dv, _reduce_to_shape(dbias, np.shape(bias)).astype(dbias.dtype, copy=False)
    return grads


attention_backward.__doc__ = attention_backward.__doc__.replace("{mask}", _MASK_DOC)


@suggest_keywords
def attention_weights(q, k, *, rows=None, top_k=None, lse=None, causal=False, causal_align="top_left",
                      key_lengths=None, query_lengths=None, window=None, keep_mask=None, bias=None, alibi_slopes=None,
                      softcap=None, scale=None, num_threads=0):
    """Exact softmax weights of chosen query rows, without the full N x M matrix.

    q [..., N, D] and k [..., M, D] as for scaled_dot_product_attention (float32; float64 is
    rounded to float32 first); scores are computed in float64. Memory is O(M) per thread besides
    the result.

    Args:
      rows: an int or a sequence of query indices (negative counts from the end); default all N.
      top_k: None for the full rows, or k for the k largest weights of each row.
      lse: the forward's log-sum-exp [..., N] (scaled_dot_product_attention(..., return_lse=True)),
          so the weights are exactly those the kernel normalized; default: recomputed in float64.
      scale, num_threads: as for scaled_dot_product_attention.
    {mask}
    Returns weights [..., R, M] float32 (masked keys and fully masked rows are 0), or with top_k
    (values [..., R, top_k] float32, indices [..., R, top_k] int64), largest first (ties: lower
    key index); slots beyond a row's allowed keys hold value 0 and index -1.

    Raises TypeError / ValueError for bad types, shapes, row indices or top_k < 1.
    """
    mask = _mask_dict(causal, causal_align, key_lengths, query_lengths, window, keep_mask, bias, alibi_slopes, softcap)
    return _qkv.attention_weights(q, k, rows, top_k, lse, mask, scale, num_threads)


attention_weights.__doc__ = attention_weights.__doc__.replace("{mask}", _MASK_DOC)


def default_num_threads():
    """Threads a call uses when num_threads=0: QKV_NUM_THREADS if positive, else OpenMP's default."""
    return _qkv.default_num_threads()


@suggest_keywords
def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, causal_align="top_left", window=None,
                     alibi_slopes=None, softcap=None, scale=None, return_lse=False, num_threads=0, dropout_p=0.0,
                     seed=None, dropout_offset=0):
    """Packed variable-length attention (FlashAttention's varlen form), float32.

    q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]: the sequences of a batch stored end
    to end; sequence s owns query rows cu_seqlens_q[s]:cu_seqlens_q[s+1] and key rows
    cu_seqlens_k[s]:cu_seqlens_k[s+1] (cu_seqlens_* start at 0, never decrease, end at the total,
    one entry more than there are sequences) and attends only to its own keys. No padding, no work
    on padding. causal (in either alignment, per sequence), window, alibi_slopes, softcap, scale and
    dropout are those of scaled_dot_product_attention, applied to each sequence as a batch of one
    (dropout: the sequence is the batch row). Returns out [total_q, H, Dv], or (out, lse) with lse
    [H, total_q] in float64 (what varlen_attention_backward takes). A sequence with queries and no
    keys gives zeros and lse -inf. The same bits for any thread count; the GIL is released.
    """
    mask = _mask_dict(causal, causal_align, None, None, window, None, None, alibi_slopes, softcap, dropout_p, seed,
                      dropout_offset)
    out, lse = _qkv.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, mask, scale, num_threads)
    return (out, lse) if return_lse else out


@suggest_keywords
def varlen_attention_backward(q, k, v, dout, out, lse, cu_seqlens_q, cu_seqlens_k, *, causal=False,
                              causal_align="top_left", window=None, alibi_slopes=None, softcap=None, scale=None,
                              num_threads=0, dropout_p=0.0, seed=None, dropout_offset=0):
    """Gradients (dq, dk, dv) of varlen_attention given dout [total_q, H, Dv] and that call's out and
    float64 lse (a float32 one is widened; other dtypes raise TypeError); every other argument as the
    forward was given it (dropout: the same seed and offset regenerate the mask)."""
    mask = _mask_dict(causal, causal_align, None, None, window, None, None, alibi_slopes, softcap, dropout_p, seed,
                      dropout_offset)
    return _qkv.varlen_backward(q, k, v, dout, out, lse, cu_seqlens_q, cu_seqlens_k, mask, scale, num_threads)
