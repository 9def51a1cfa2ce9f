"""Decode attention against a paged KV cache (qkv.KVCache; see include/qkv/kv_cache.h)."""

from . import _qkv
from ._keywords import suggest_keywords

KVCache = _qkv.KVCache


@suggest_keywords
def apply_rotary(x, positions=0, *, layout="half_split", theta=10000.0, rotary_dim=0):
    """Rotary position embeddings (RoPE) of x [N, D], [H, N, D] or [B, H, N, D] (float32; float64
    is rounded), returned as a new float32 array: token n of batch row b sits at position
    positions + n, or positions[b] + n with one integer per batch row. layout "half_split" pairs
    (x[p], x[p + rotary_dim/2]) (GPT-NeoX, Llama), "interleaved" pairs (x[2p], x[2p+1]) (GPT-J);
    the angle is position * theta^(-2p / rotary_dim); elements past rotary_dim (0 = all D) pass
    through. The same rotation KVCache.append(..., rotary=) gives the keys, so for a decode step
    rotate q at the new tokens' positions: apply_rotary(q, [cache.length(s) - N for s in seq_ids]).
    Angles are computed in float64."""
    return _qkv.apply_rotary(x, positions, {"layout": layout, "theta": theta, "rotary_dim": rotary_dim})


@suggest_keywords
def decode_attention(q, cache, seq_ids, *, causal=True, window=None, alibi_slopes=None, softcap=None,
                     query_lengths=None, sinks=None, sink_tokens=0, scale=None, return_lse=False, num_threads=0,
                     simd="auto"):
    """Attention of q [B, H, N, D] (N new tokens per sequence, float32) over the cached keys and
    values of the B sequences `seq_ids` of `cache`; returns out [B, H, N, Dv] (and lse [B, H, N]).

    causal: bottom-right aligned (the new tokens' keys are already appended, so query i sits at
    position length - N + i). window: (left, right) around that diagonal. sinks: one logit per
    query head that joins each row's softmax denominator (gpt-oss). sink_tokens: StreamingLLM, the
    first sink_tokens keys stay visible in addition to the window (never past the diagonal, causal
    or not). q is used as given: rotate it first where the cache's keys were rotated on append
    (apply_rotary). ALiBi adds -slope * |j - diag(i)|, so the output equals FlashAttention's causal
    ALiBi but lse differs from its by slope * (length - 1 - diag(i)) (its causal bias is
    slope * (j - length + 1)). Rows with no allowed key are 0.
    Bitwise the same result for any num_threads.
    """
    return _qkv.decode_attention(q, cache, seq_ids, _mask(causal, window, alibi_slopes, softcap, query_lengths),
                                 scale, sinks, sink_tokens, return_lse, num_threads, simd)


@suggest_keywords
def decode_attention_weights(q, cache, seq_ids, *, top_k=None, causal=True, window=None, alibi_slopes=None,
                             softcap=None, query_lengths=None, sinks=None, sink_tokens=0, scale=None):
    """The exact softmax weights of decode_attention's rows over each sequence's cached keys
    (float64 scores from the stored values, rounded to float32), for explain tooling and KV
    eviction policies (H2O-style heavy hitters need per-key attention mass).

    Same arguments as decode_attention. Returns weights [B, H, N, max length] (0 for keys a row
    does not see or past its sequence; with sinks a row sums to 1 - exp(sink - lse)); with
    top_k, (values, indices) [B, H, N, top_k] of each row's largest weights, largest first (ties:
    the lower key), index -1 and value 0 past the keys a row sees. Memory O(max length) per row
    besides the result.
    """
    return _qkv.decode_attention_weights(q, cache, seq_ids, _mask(causal, window, alibi_slopes, softcap, query_lengths),
                                         scale, sinks, sink_tokens, top_k)


def _mask(causal, window, alibi_slopes, softcap, query_lengths):
    # Unconverted: the binding refuses what is not True/False, an integer or a number by name.
    return {"causal": causal, "window": window, "alibi_slopes": alibi_slopes, "softcap": softcap,
            "query_lengths": query_lengths}
