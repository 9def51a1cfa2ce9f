#!/usr/bin/python3
"""Contextual embeddings for a sentence with qkv.

Static word vectors (GloVe / word2vec, or a small seeded demo vocabulary) go through one
multi-head self-attention layer; each token's output row mixes in the tokens it attends to,
so the same word gets different vectors in different sentences.

    PYTHONPATH=build/python /usr/bin/python3 examples/contextual_embeddings.py \
        "I went to the bank to deposit money"
    ... --embeddings glove.6B.50d.txt --heads 2 --compare "We sat by the river bank" --word bank
    ... --weights layer.safetensors --save context.npy
    ... --parameter-free      (Q = K = V = X: each output is a weighted mix of the input vectors)

Without --embeddings each word gets a fixed pseudo-random vector (seeded by the word), which is
enough to see the mechanics but carries no meaning.
"""

import argparse
import sys
import zlib

import numpy as np

import qkv


def demo_embeddings(sentences, dim):
    """A vocabulary of the sentences' tokens with vectors seeded by each word (same word, same vector)."""
    words = sorted({t for s in sentences for t in qkv.tokenize(s)})
    if not words:
        raise ValueError("nothing to embed: the sentence has no words")
    matrix = np.stack([np.random.default_rng(zlib.crc32(w.encode())).standard_normal(dim) for w in words])
    return qkv.Embeddings(words, matrix.astype(np.float32))


def contextualize(emb, layer, sentence, oov):
    """(tokens, static X [N, E], contextual [N, E], attention weights per head [H, N, N])."""
    tokens, x, missing = emb.embed(sentence, oov=oov)
    if missing:
        print(f"note: not in the vocabulary ({oov}): {', '.join(missing)}", file=sys.stderr)
    context = layer.forward(x)
    steps = qkv.explain(x=x, layer=layer, tokens=tokens)
    weights = np.stack([h["weights"] for h in steps["heads"]])
    return tokens, x, context, weights


def cosine(a, b):
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0


def print_sentence(tokens, x, context, weights):
    width = max(len(t) for t in tokens)
    print(f"{'token':<{width}}  cos(static, contextual)  attends most to (head 1)")  # heads count from 1, as in qkv's pages
    for i, t in enumerate(tokens):
        top = np.argsort(-weights[0, i])[:3]
        attends = ", ".join(f"{tokens[j]} {weights[0, i, j]:.2f}" for j in top)
        print(f"{t:<{width}}  {cosine(x[i], context[i]):>22.4f}  {attends}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sentence")
    parser.add_argument("--embeddings", help="GloVe or word2vec file (default: a seeded demo vocabulary)")
    parser.add_argument("--weights", help="a layer saved by MultiHeadAttention.save (default: seeded random)")
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--parameter-free", action="store_true", help="Q = K = V = X, no weights (seed 002)")
    parser.add_argument("--seed", type=int, default=0, help="initialization seed of the random layer")
    parser.add_argument("--dim", type=int, default=16, help="vector width of the demo vocabulary")
    parser.add_argument("--oov", choices=["error", "zero", "skip"], default="skip")
    parser.add_argument("--compare", metavar="SENTENCE", help="a second sentence sharing --word")
    parser.add_argument("--word", help="the word whose contextual vectors --compare contrasts")
    parser.add_argument("--save", metavar="OUT.npy", help="write the contextual embeddings [N, E]")
    args = parser.parse_args(argv)

    try:
        sentences = [args.sentence] + ([args.compare] if args.compare else [])
        emb = qkv.Embeddings.load(args.embeddings) if args.embeddings else demo_embeddings(sentences, args.dim)
        if args.weights:
            layer = qkv.MultiHeadAttention.load(args.weights)
            if layer.embed_dim != emb.dim:
                raise ValueError(f"the layer expects width {layer.embed_dim} but the embeddings have {emb.dim}")
        elif args.parameter_free:
            layer = qkv.MultiHeadAttention(emb.dim, parameter_free=True)
        else:
            layer = qkv.MultiHeadAttention(emb.dim, args.heads, seed=args.seed)
        print(f"{layer!r} on embeddings of width {emb.dim}")
        tokens, x, context, weights = contextualize(emb, layer, args.sentence, args.oov)
        print_sentence(tokens, x, context, weights)
        if args.save:
            np.save(args.save, context)
            print(f"wrote {args.save}: {context.shape[0]} x {context.shape[1]} float32")
        if args.compare:
            if not args.word:
                raise ValueError("--compare needs --word")
            word = qkv.tokenize(args.word)[0]
            tokens2, x2, context2, _ = contextualize(emb, layer, args.compare, args.oov)
            if word not in tokens or word not in tokens2:
                raise ValueError(f"'{word}' must occur in both sentences")
            i, j = tokens.index(word), tokens2.index(word)
            print(f"'{word}': static vectors cos = {cosine(x[i], x2[j]):.4f}; "
                  f"contextual vectors cos = {cosine(context[i], context2[j]):.4f}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
