"""Decode attention against a paged KV cache (qkv.KVCache; see include/qkv/kv_cache.h)."""

from . import _qkv

KVCache = _qkv.KVCache


def decode_attention(q, cache, seq_ids, *, causal=True, window=None, alibi_slopes=None, softcap=None,
                     query_lengths=None, sinks=None, sink_tokens=0, scale=None, return_lse=False, num_threads=0,
                     simd="auto"):
    """Attention of q [B, H, N, D] (N new tokens per sequence, float32) over the cached keys and
    values of the B sequences `seq_ids` of `cache`; returns out [B, H, N, Dv] (and lse [B, H, N]).

    causal: bottom-right aligned (the new tokens' keys are already appended, so query i sits at
    position length - N + i). window: (left, right) around that diagonal. sinks: one logit per
    query head that joins each row's softmax denominator (gpt-oss). sink_tokens: StreamingLLM, the
    first sink_tokens keys stay visible in addition to the window. Rows with no allowed key are 0.
    Bitwise the same result for any num_threads.
    """
    mask = {"causal": bool(causal), "window": window, "alibi_slopes": alibi_slopes, "softcap": softcap,
            "query_lengths": query_lengths}
    return _qkv.decode_attention(q, cache, [int(s) for s in seq_ids], mask, scale,
                                 [] if sinks is None else [float(s) for s in sinks], int(sink_tokens),
                                 bool(return_lse), int(num_threads), simd)
