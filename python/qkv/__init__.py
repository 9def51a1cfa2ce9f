"""qkv: exact, fast self-attention on numpy arrays.

    import numpy as np, qkv
    q = k = v = np.random.default_rng(0).standard_normal((8, 64), dtype=np.float32)
    out = qkv.scaled_dot_product_attention(q, k, v, causal=True)

Functions take numpy arrays shaped like PyTorch's ([..., N, D]) and return new numpy arrays.
Bad input raises TypeError (wrong type or dtype) or ValueError (wrong shape or value), never
crashes. PyTorch users: `import qkv.torch` (scaled_dot_product_attention and MultiheadAttention with
autograd); `import qkv` itself never imports torch.
"""

from . import _qkv
from ._qkv import __version__, simd_path  # noqa: F401
from .attention import (attention_backward, attention_weights, default_num_threads, dropout_mask,  # noqa: F401
                        scaled_dot_product_attention, varlen_attention, varlen_attention_backward)

from ._qkv import Embeddings, MultiHeadAttention, Optimizer, clip_grad_norm, explain_examples, load_embeddings, lr_at, tokenize  # noqa: F401,E501
from .optim import SGD, AdamW  # noqa: F401
from .cache import KVCache, apply_rotary, decode_attention, decode_attention_weights  # noqa: F401
from .sentence import SentenceLayer, compare, context, data_file, explain, load_layer  # noqa: F401


class HtmlPage(str):
    """A self-contained HTML page (what qkv.explain(..., format="html") returns and `qkv explain
    --html` writes), as a str. Jupyter shows it inline through _repr_html_: the page inside an
    iframe's srcdoc, so its script and styles stay apart from the notebook's and two pages in one
    notebook do not share element ids. save(path) writes the page to a file."""

    def _repr_html_(self):
        import html
        return ('<iframe class="qkv-page" title="qkv attention page" style="width:100%;height:760px;'
                'border:1px solid #ccc;resize:vertical" srcdoc="' + html.escape(str(self), quote=True) + '"></iframe>')

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(self)

__all__ = ["__version__", "MultiHeadAttention", "Embeddings", "load_embeddings", "tokenize", "explain", "explain_examples", "HtmlPage",
           "context", "compare", "load_layer", "data_file", "SentenceLayer",
           "Optimizer", "SGD", "AdamW", "clip_grad_norm", "lr_at",
           "scaled_dot_product_attention", "attention_backward", "attention_weights", "default_num_threads", "dropout_mask",
           "varlen_attention", "varlen_attention_backward",
           "simd_path", "KVCache", "apply_rotary", "decode_attention", "decode_attention_weights"]
