"""Sentences through a layer, from Python: what `qkv explain SENTENCE`, `qkv context` and `qkv
compare` do on the command line, with the same defaults.

    import qkv
    qkv.context("we sat on the bank of the river")["vectors"]       # [N, E] contextual vectors
    qkv.compare("bank", "we sat on the bank of the river", "she put her money in the bank")
    qkv.explain(sentence="the bank of the river flooded", format="html")   # the page, inline in Jupyter

Without a layer argument every function uses the trained layer (context-layer.safetensors, built by
`make demo` and installed with the package) with the word vectors it was trained on (words.txt), and
says so in its result's "layer" text. A random layer only on request (random_weights=SEED).
"""
import os
from pathlib import Path

import numpy as np

from . import _qkv

DEFAULT_LAYER = "context-layer.safetensors"
DEFAULT_WORDS = "words.txt"


def data_dirs():
    """Where data_file() looks, in order: $QKV_DATA_DIR (if set and not empty); the pip package's
    qkv/share/qkv; a build tree's data/ (build/python/qkv -> build/data); an installed prefix's
    share/qkv (<prefix>/lib/pythonX/site-packages/qkv -> <prefix>/share/qkv, the .deb's /usr)."""
    here = Path(__file__).resolve().parent
    dirs = []
    env = os.environ.get("QKV_DATA_DIR")
    if env:
        dirs.append(Path(env))
    dirs += [here / "share" / "qkv", here.parent.parent / "data"]
    if len(here.parents) > 3:
        dirs.append(here.parents[3] / "share" / "qkv")
    return dirs


def data_file(name):
    """The path of the data file `name` (words.txt, context-layer.safetensors) the sentence functions
    use by default, or None when no directory of data_dirs() has it."""
    for d in data_dirs():
        if (d / name).is_file():
            return str(d / name)
    return None


def _searched():
    return ", ".join(str(d) for d in data_dirs())


class SentenceLayer:
    """A layer and the word vectors it reads: what load_layer() resolves the keyword arguments to.

    layer: a qkv.MultiHeadAttention; embeddings: a qkv.Embeddings; embeddings_path: its file;
    description: one line saying which layer this is and how it was made (what the CLI prints);
    weights_label: "trained (F)", "learned (F)", "random (seed S)" or None (parameter-free)."""

    def __init__(self, layer, embeddings, embeddings_path, description, weights_label):
        self.layer, self.embeddings, self.embeddings_path = layer, embeddings, embeddings_path
        self.description, self.weights_label = description, weights_label

    def __repr__(self):
        return f"SentenceLayer({self.description})"


def _heads_text(layer):
    d = layer.head_dim
    return f"{layer.num_heads} head{'' if layer.num_heads == 1 else 's'}, d_k = {d}"


def load_layer(weights=None, *, embeddings=None, random_weights=None, parameter_free=False, num_heads=1):
    """Resolves which layer and word vectors the sentence functions use.

    weights: a layer file (MultiHeadAttention.save, `qkv train --save`); default: the trained layer
    data_file("context-layer.safetensors"), with the words.txt beside it. random_weights=SEED: a
    random layer of num_heads heads (no output projection) instead; parameter_free=True: Q = K = V = X.
    embeddings: word vectors (GloVe / word2vec file); default $QKV_EMBEDDINGS, else data_file("words.txt")
    (QKV_EMBEDDINGS set but empty: no default).
    Raises FileNotFoundError saying how to get the data when it is missing, ValueError when the trained
    layer and the word vectors do not belong together or the options conflict."""
    chosen = (weights is not None) + (random_weights is not None) + bool(parameter_free)
    if chosen > 1:
        raise ValueError("load_layer: give at most one of weights, random_weights, parameter_free")
    if embeddings is None:
        env = os.environ.get("QKV_EMBEDDINGS")
        # Set but empty turns the default off, as it does for the command.
        embeddings = env if env else (None if env == "" else data_file(DEFAULT_WORDS))
        if embeddings is None:
            raise FileNotFoundError(f"no word vectors: pass embeddings=F, set QKV_EMBEDDINGS=F, or build the default "
                                    f"{DEFAULT_WORDS} with `make demo` (searched: {_searched()})")
    vectors = _qkv.Embeddings.load(str(embeddings))
    E = vectors.dim
    if parameter_free:
        layer = _qkv.MultiHeadAttention(E, parameter_free=True)
        return SentenceLayer(layer, vectors, str(embeddings), "parameter-free (Q = K = V = X, seed 002)", None)
    if random_weights is not None:
        layer = _qkv.MultiHeadAttention(E, num_heads, output_projection=False, seed=random_weights)
        return SentenceLayer(layer, vectors, str(embeddings),
                             f"random W_q, W_k, W_v (seed {random_weights}), {_heads_text(layer)}",
                             f"random (seed {random_weights})")
    default = weights is None
    if default:
        weights = data_file(DEFAULT_LAYER)
        alternatives = ("weights=F (`qkv train --task context --embeddings VECTORS --save F` trains one), "
                        "random_weights=SEED (a random layer) or parameter_free=True (Q = K = V = X)")
        if weights is None:
            raise FileNotFoundError(f"no trained layer: `make demo` builds {DEFAULT_LAYER} beside the word vectors "
                                    f"(searched: {_searched()}); or pass {alternatives}")
        # A layer is trained on one set of vectors: with any other file its weights mean nothing.
        beside = Path(weights).parent / DEFAULT_WORDS
        if not (beside.exists() and os.path.samefile(beside, embeddings)):
            raise ValueError(f"the trained layer {weights} goes with the word vectors {beside}, not {embeddings}: "
                             f"pass {alternatives}")
    layer = _qkv.MultiHeadAttention.load(str(weights))
    if layer.embed_dim != E:
        raise ValueError(f"weights {weights}: the layer takes rows of width E = {layer.embed_dim}, but the "
                         f"embeddings have width {E}")
    name = Path(weights).name
    what = "the trained layer" if default else "learned weights from"
    description = f"{what} {name}, {_heads_text(layer)}" + (f": {layer.note}" if layer.note else "")
    return SentenceLayer(layer, vectors, str(embeddings), description,
                         f"{'trained' if default else 'learned'} ({name})")


def _resolve(layer, kwargs):
    if layer is not None:
        if kwargs:
            raise ValueError(f"give either layer=SentenceLayer or {', '.join(sorted(kwargs))}, not both")
        if not isinstance(layer, SentenceLayer):
            raise TypeError(f"layer must be a qkv.SentenceLayer (from qkv.load_layer), got {type(layer).__name__}")
        return layer
    return load_layer(**kwargs)


def _embed(s, sentence, oov):
    tokens, x, missing = s.embeddings.embed(sentence, oov=oov)
    return list(tokens), np.asarray(x, dtype=np.float32), list(missing)


def context(sentence, *, oov="error", layer=None, **layer_args):
    """Every word's contextual vector in `sentence` (what `qkv context --format json` prints).

    Returns {sentence, tokens, missing, dim, vectors [N, E'] float32, layer (its description)}.
    layer: a SentenceLayer from load_layer(); otherwise load_layer's keyword arguments (weights,
    embeddings, random_weights, parameter_free, num_heads). oov: "error", "zero" or "skip"."""
    s = _resolve(layer, layer_args)
    tokens, x, missing = _embed(s, sentence, oov)
    out = np.asarray(s.layer.forward(x), dtype=np.float32)
    return {"sentence": sentence, "tokens": tokens, "missing": missing, "dim": int(out.shape[1]),
            "vectors": out, "layer": s.description}


def _cosine(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0


def compare(word, sentence_a, sentence_b, *, oov="error", layer=None, **layer_args):
    """One word in two sentences (what `qkv compare --json` prints, without the nearest words): its
    static vector is the same in both, its contextual vectors differ by what it attends to.

    Returns {word, static_cosine, contextual_cosine, layer, sentences: [{text, tokens, position,
    weights [H][N] (the word's attention row per head), vector [E'] float32}]}. The word must be one
    token of the vocabulary and occur in both sentences (its first occurrence is used)."""
    s = _resolve(layer, layer_args)
    want = _qkv.tokenize(word)
    if len(want) != 1:
        raise ValueError(f"compare: the word must be exactly one token, got {want} from {word!r}")
    word = want[0]
    if s.embeddings.find(word) < 0:
        raise ValueError(f"compare: {word!r} is not in {s.embeddings_path}")
    sides = []
    for n, sentence in enumerate((sentence_a, sentence_b), 1):
        tokens, x, _ = _embed(s, sentence, oov)
        if word not in tokens:
            raise ValueError(f"compare: sentence {n} ({sentence!r}) does not contain {word!r}; its tokens: {tokens}")
        p = tokens.index(word)
        steps = _qkv.explain(x=x, layer=s.layer, tokens=tokens)
        vector = np.asarray(s.layer.forward(x), dtype=np.float32)[p]
        sides.append({"text": sentence, "tokens": tokens, "position": p,
                      "weights": [h["weights"][p].tolist() for h in steps["heads"]], "vector": vector})
    static = s.embeddings.vector(word)
    return {"word": word, "static_cosine": _cosine(static, static),
            "contextual_cosine": _cosine(sides[0]["vector"], sides[1]["vector"]),
            "layer": s.description, "sentences": sides}


def explain(example=None, *, sentence=None, oov="error", layer=None, weights=None, embeddings=None,
            random_weights=None, parameter_free=False, **kwargs):
    """qkv.explain(sentence="...") explains a sentence through the trained layer (or the one
    load_layer's arguments, or layer=SentenceLayer, choose), titled and labelled as `qkv explain
    "SENTENCE"` is, 4 decimals in text; every other call is the explain() documented below."""
    picks = {"weights": weights, "embeddings": embeddings, "random_weights": random_weights}
    picks = {k: v for k, v in picks.items() if v is not None}
    if parameter_free:
        picks["parameter_free"] = True
    if sentence is None:
        if picks:
            raise ValueError(f"explain: {', '.join(sorted(picks))} applies only with sentence=")
        return _qkv.explain(example, layer=layer, **kwargs)  # layer: a MultiHeadAttention for x
    if example is not None or any(kwargs.get(k) is not None for k in ("x", "q", "k", "v", "w_q", "tokens")):
        raise ValueError("explain: sentence= brings its own tokens and x; give no example, x, q/k/v or w_q/w_k/w_v")
    if "num_heads" in kwargs:
        picks["num_heads"] = kwargs.pop("num_heads")
    kwargs.setdefault("precision", 4)  # what `qkv explain SENTENCE` prints: word vectors need no more
    s = _resolve(layer, picks)
    tokens, x, _ = _embed(s, sentence, oov)
    labels = {"title": f'Self-attention for "{sentence}"', "style": "sentence",
              "source": f"embeddings from {Path(s.embeddings_path).name} (width {s.embeddings.dim}); {s.description}"}
    if s.weights_label:
        labels["weights"] = s.weights_label
    return _qkv.explain(x=x, tokens=tokens, layer=s.layer, labels=labels, **kwargs)


explain.__doc__ += "\n" + (_qkv.explain.__doc__ or "")
