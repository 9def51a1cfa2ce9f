"""qkv: exact, fast self-attention on numpy arrays.

    import numpy as np, qkv
    q = k = v = np.random.default_rng(0).standard_normal((8, 64), dtype=np.float32)
    out = qkv.scaled_dot_product_attention(q, k, v, causal=True)

Functions take numpy arrays shaped like PyTorch's ([..., N, D]) and return new numpy arrays.
Bad input raises TypeError (wrong type or dtype) or ValueError (wrong shape or value), never
crashes. `qkv.features` lists the parts compiled into this build.
"""

from . import _qkv
from ._qkv import simd_path  # noqa: F401
from .attention import attention_backward, attention_weights, default_num_threads, scaled_dot_product_attention

features = _qkv.features

__all__ = []
if "layer" in features:
    from ._qkv import MultiHeadAttention  # noqa: F401
    __all__ += ["MultiHeadAttention"]
if "embeddings" in features:
    from ._qkv import Embeddings, load_embeddings, tokenize  # noqa: F401
    __all__ += ["Embeddings", "load_embeddings", "tokenize"]
if "explain" in features:
    from ._qkv import explain, explain_examples  # noqa: F401
    __all__ += ["explain", "explain_examples"]
if "optim" in features:
    from ._qkv import Optimizer, clip_grad_norm, lr_at  # noqa: F401
    from .optim import SGD, AdamW  # noqa: F401
    __all__ += ["Optimizer", "SGD", "AdamW", "clip_grad_norm", "lr_at"]

__all__ += ["scaled_dot_product_attention", "attention_backward", "attention_weights", "default_num_threads",
            "simd_path", "features"]
